// rattn-llama-eval: teacher-forced next-token evaluation through llama.cpp's
// public API, and the comparison of two evaluations.
//
//   rattn-llama-eval eval -m MODEL.gguf (--text FILE --tokens N | --token-file FILE)
//                    --score S [--threads T] [--ubatch U] [--batched] [--flash-attn on|off|auto]
//                    [--cache-type f16|bf16|f32]
//                    [-o OUT]
//     Prefills the first N - S tokens (batches of U), then decodes the rest one
//     token at a time, each step fed the text's own token. With RATTN_PLAN set
//     the plan's layers run through rattn (prefill handed over, every step a
//     rattn decode step). OUT: "# tokens id ..." then one line per scored
//     position: "pos target argmax nll". Prints perplexity, the first decode
//     step's seconds (with RATTN_PLAN it builds the indexes), the later steps'
//     seconds per token and peak resident memory. --batched scores every position in
//     batches (llama.cpp's full attention: the same logits, much faster).
//     --cache-type: llama.cpp's K and V cache dtype (llama-cli's -ctk/-ctv);
//     with RATTN_PLAN rattn stores K/V in the same dtype.
//   rattn-llama-eval compare A B [--min-agreement X] [--max-ppl-change Y]
//     Greedy agreement (argmax equal at the same positions) and the perplexity
//     change of B against A; non-zero status when outside the bounds.
//   rattn-llama-eval passkey -m MODEL.gguf --tokens N --depth F [--threads T]
//     A passkey retrieval prompt of about N tokens with the key at relative
//     depth F; prints the greedy answer and whether it holds the key.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct fail : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct args {
    std::vector<std::string> pos;
    std::string model, text, token_file, out;
    long tokens = 0, score = 0, threads = 2, ubatch = 512;
    double min_agreement = -1, max_ppl_change = -1, depth = 0.5;
    bool batched = false;
    std::string flash_attn = "auto";
    std::string cache_type = "f16";
};

long to_long(const std::string & opt, const std::string & v, long lo) {
    char * end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || x < lo) {
        throw fail(opt + ": '" + v + "' is not an integer >= " + std::to_string(lo));
    }
    return x;
}

double to_double(const std::string & opt, const std::string & v) {
    char * end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x)) {
        throw fail(opt + ": '" + v + "' is not a number");
    }
    return x;
}

args parse(int argc, char ** argv) {
    args a;
    for (int i = 1; i < argc; ++i) {
        const std::string o = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                throw fail(o + " needs a value");
            }
            return argv[++i];
        };
        if (o == "-m") a.model = value();
        else if (o == "--text") a.text = value();
        else if (o == "--token-file") a.token_file = value();
        else if (o == "-o") a.out = value();
        else if (o == "--tokens") a.tokens = to_long(o, value(), 2);
        else if (o == "--score") a.score = to_long(o, value(), 1);
        else if (o == "--threads") a.threads = to_long(o, value(), 1);
        else if (o == "--ubatch") a.ubatch = to_long(o, value(), 1);
        else if (o == "--min-agreement") a.min_agreement = to_double(o, value());
        else if (o == "--max-ppl-change") a.max_ppl_change = to_double(o, value());
        else if (o == "--depth") a.depth = to_double(o, value());
        else if (o == "--batched") a.batched = true;
        else if (o == "--flash-attn") a.flash_attn = value();
        else if (o == "--cache-type") a.cache_type = value();
        else if (!o.empty() && o[0] == '-') throw fail("unknown option " + o);
        else a.pos.push_back(o);
    }
    return a;
}

std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        throw fail("cannot read '" + path + "'");
    }
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Writes data to path whole or not at all: a temporary file beside it, renamed
// over it (the tool links libllama only, not rattn's core/atomic_file.h).
void write_file(const std::string & path, const std::string & data) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary);
        f << data;
        f.flush();
        if (!f) {
            std::remove(tmp.c_str());
            throw fail("cannot write '" + path + "'");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw fail("cannot write '" + path + "'");
    }
}

double peak_rss_mib() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("VmHWM:", 0) == 0) {
            return std::atof(line.c_str() + 6) / 1024.0;
        }
    }
    return 0;
}

struct model_ctx {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    const llama_vocab * vocab = nullptr;
    ~model_ctx() {
        llama_free(ctx);
        llama_model_free(model);
    }
};

void load(model_ctx & m, const args & a, long n_ctx) {
    llama_model_params mp = llama_model_default_params();
    m.model = llama_model_load_from_file(a.model.c_str(), mp);
    if (!m.model) {
        throw fail("cannot load model '" + a.model + "'");
    }
    m.vocab = llama_model_get_vocab(m.model);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(n_ctx);
    cp.n_batch = uint32_t(a.ubatch);
    cp.n_ubatch = uint32_t(a.ubatch);
    cp.n_seq_max = 1;
    cp.n_threads = int32_t(a.threads);
    cp.n_threads_batch = int32_t(a.threads);
    if (a.flash_attn == "on") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    else if (a.flash_attn == "off") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    else if (a.flash_attn != "auto") throw fail("--flash-attn: on, off or auto");
    if (a.cache_type == "f16") cp.type_k = GGML_TYPE_F16;
    else if (a.cache_type == "bf16") cp.type_k = GGML_TYPE_BF16;
    else if (a.cache_type == "f32") cp.type_k = GGML_TYPE_F32;
    else throw fail("--cache-type: f16, bf16 or f32");
    cp.type_v = cp.type_k;
    m.ctx = llama_init_from_model(m.model, cp);
    if (!m.ctx) {
        throw fail("cannot create a context (see the messages above)");
    }
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool bos) {
    std::vector<llama_token> ids(text.size() + 8);
    int n = llama_tokenize(vocab, text.data(), int32_t(text.size()), ids.data(), int32_t(ids.size()), bos, false);
    if (n < 0) {
        ids.resize(size_t(-n));
        n = llama_tokenize(vocab, text.data(), int32_t(text.size()), ids.data(), int32_t(ids.size()), bos, false);
    }
    if (n < 0) {
        throw fail("tokenization failed");
    }
    ids.resize(size_t(n));
    return ids;
}

// The first n tokens of a text (cut at a line end, as much as needed).
std::vector<llama_token> tokenize_prefix(const llama_vocab * vocab, const std::string & text, long n) {
    size_t bytes = size_t(n) * 6 + 4096;
    for (;;) {
        size_t cut = std::min(bytes, text.size());
        if (cut < text.size()) {
            const size_t nl = text.rfind('\n', cut);
            if (nl != std::string::npos && nl > cut / 2) cut = nl + 1;
        }
        std::vector<llama_token> ids = tokenize(vocab, text.substr(0, cut), true);
        if (long(ids.size()) >= n) {
            ids.resize(size_t(n));
            return ids;
        }
        if (cut >= text.size()) {
            throw fail("the text has " + std::to_string(ids.size()) + " tokens, fewer than " + std::to_string(n));
        }
        bytes *= 2;
    }
}

std::vector<llama_token> read_token_file(const std::string & path) {
    std::istringstream in(read_file(path));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("# tokens", 0) == 0) {
            std::istringstream ls(line.substr(8));
            std::vector<llama_token> ids;
            long x;
            while (ls >> x) ids.push_back(llama_token(x));
            return ids;
        }
    }
    throw fail("'" + path + "' has no '# tokens' line");
}

// Decodes tokens [p0, p1) at their positions in batches of ubatch, with
// logits for every position >= from (default: the last one only), each
// passed to each(pos, logits).
void decode_range(llama_context * ctx, const std::vector<llama_token> & ids, long p0, long p1, long ubatch,
                  long from = -1, const std::function<void(long, const float *)> & each = nullptr) {
    if (from < 0) {
        from = p1 - 1;
    }
    llama_batch b = llama_batch_init(int32_t(ubatch), 0, 1);
    for (long s = p0; s < p1; s += ubatch) {
        const long e = std::min(p1, s + ubatch);
        b.n_tokens = int32_t(e - s);
        for (long i = s; i < e; ++i) {
            const int32_t j = int32_t(i - s);
            b.token[j] = ids[size_t(i)];
            b.pos[j] = llama_pos(i);
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = 0;
            b.logits[j] = i >= from;
        }
        if (llama_decode(ctx, b) != 0) {
            llama_batch_free(b);
            throw fail("llama_decode failed at position " + std::to_string(s));
        }
        for (long i = std::max(s, from); each && i < e; ++i) {
            each(i, llama_get_logits_ith(ctx, int32_t(i - s)));
        }
    }
    llama_batch_free(b);
}

llama_token argmax(const float * logits, int n) {
    return llama_token(std::max_element(logits, logits + n) - logits);
}

double nll(const float * logits, int n, llama_token target) {
    const float mx = *std::max_element(logits, logits + n);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i] - mx));
    return std::log(sum) + mx - logits[target];
}

int run_eval(const args & a) {
    if (a.model.empty() || a.score <= 0 || (a.text.empty() == a.token_file.empty())) {
        throw fail("eval needs -m, --score and one of --text (with --tokens) or --token-file");
    }
    model_ctx m;
    std::vector<llama_token> ids;
    long n = a.tokens;
    if (!a.token_file.empty()) {
        ids = read_token_file(a.token_file);
        n = n > 0 ? std::min<long>(n, long(ids.size())) : long(ids.size());
        ids.resize(size_t(n));
    }
    if (a.batched && std::getenv("RATTN_PLAN")) {
        throw fail("--batched scores with llama.cpp's full attention only (under RATTN_PLAN a batch extends the prompt)");
    }
    if (n < a.score + 1) {
        throw fail("--score must leave at least one prompt token");
    }
    load(m, a, n + 1);
    if (ids.empty()) {
        ids = tokenize_prefix(m.vocab, read_file(a.text), n);
    }
    const int nv = llama_vocab_n_tokens(m.vocab);
    const long P = n - a.score;
    const auto t0 = std::chrono::steady_clock::now();
    decode_range(m.ctx, ids, 0, P, a.ubatch);
    const auto t1 = std::chrono::steady_clock::now();
    std::ostringstream out;
    out << "# tokens";
    for (llama_token t : ids) out << ' ' << t;
    out << '\n';
    double total = 0;
    auto score = [&](long p, const float * lg) {
        const double l = nll(lg, nv, ids[size_t(p)]);
        total += l;
        out << p << ' ' << ids[size_t(p)] << ' ' << argmax(lg, nv) << ' ' << l << '\n';
    };
    score(P, llama_get_logits_ith(m.ctx, -1));
    auto t_first = t1;  // the end of the first one-token step
    if (a.batched) {
        // logits at position p - 1 score token p
        decode_range(m.ctx, ids, P, n - 1, a.ubatch, P, [&](long p, const float * lg) { score(p + 1, lg); });
    } else {
        for (long p = P + 1; p < n; ++p) {
            decode_range(m.ctx, ids, p - 1, p, 1);
            score(p, llama_get_logits_ith(m.ctx, -1));
            if (p == P + 1) t_first = std::chrono::steady_clock::now();
        }
    }
    const auto t2 = std::chrono::steady_clock::now();
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    // Under RATTN_PLAN the first step also builds the indexes (the end of
    // rattn's prefill): it is reported apart from the steady decode steps.
    const double first_step_s = a.batched ? 0 : std::chrono::duration<double>(t_first - t1).count();
    const double decode_s = a.batched ? (a.score > 1 ? std::chrono::duration<double>(t2 - t1).count() / double(a.score - 1) : 0)
                            : a.score > 2 ? std::chrono::duration<double>(t2 - t_first).count() / double(a.score - 2)
                                          : 0;
    if (!a.out.empty()) {
        write_file(a.out, out.str());
    }
    std::printf("tokens %ld scored %ld perplexity %.6f prefill_s %.2f first_step_s %.2f decode_s_per_token %.4f "
                "decode_tokens_per_s %.2f peak_rss_mib %.0f rattn %s\n",
                n, a.score, std::exp(total / double(a.score)), prefill_s, first_step_s, decode_s,
                decode_s > 0 ? 1.0 / decode_s : 0.0, peak_rss_mib(), std::getenv("RATTN_PLAN") ? "on" : "off");
    return 0;
}

struct scored {
    std::vector<long> pos, target, top;
    std::vector<double> nll;
};

scored read_scored(const std::string & path) {
    std::istringstream in(read_file(path));
    std::string line;
    scored s;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ls(line);
        long p, t, g;
        double l;
        if (!(ls >> p >> t >> g >> l)) throw fail("'" + path + "': bad line '" + line + "'");
        s.pos.push_back(p);
        s.target.push_back(t);
        s.top.push_back(g);
        s.nll.push_back(l);
    }
    if (s.pos.empty()) throw fail("'" + path + "' scores no position");
    return s;
}

int run_compare(const args & a) {
    if (a.pos.size() != 3) throw fail("compare needs two files");
    const scored x = read_scored(a.pos[1]), y = read_scored(a.pos[2]);
    if (x.pos != y.pos || x.target != y.target) {
        throw fail("the two files score different positions or tokens");
    }
    long agree = 0;
    double nx = 0, ny = 0;
    for (size_t i = 0; i < x.pos.size(); ++i) {
        agree += x.top[i] == y.top[i];
        nx += x.nll[i];
        ny += y.nll[i];
    }
    const double k = double(x.pos.size());
    const double agreement = double(agree) / k;
    const double px = std::exp(nx / k), py = std::exp(ny / k);
    const double change = py / px - 1.0;
    std::printf("positions %zu agreement %.4f (%ld) perplexity %.6f vs %.6f change %+.4f%%\n", x.pos.size(), agreement,
                agree, px, py, 100.0 * change);
    bool ok = true;
    if (a.min_agreement >= 0 && agreement < a.min_agreement) {
        std::printf("FAIL: agreement %.4f < %.4f\n", agreement, a.min_agreement);
        ok = false;
    }
    if (a.max_ppl_change >= 0 && std::fabs(change) > a.max_ppl_change) {
        std::printf("FAIL: |perplexity change| %.4f > %.4f\n", std::fabs(change), a.max_ppl_change);
        ok = false;
    }
    return ok ? 0 : 1;
}

// The usual passkey prompt: filler lines around one key line.
int run_passkey(const args & a) {
    if (a.model.empty() || a.tokens <= 0 || a.depth < 0 || a.depth > 1) {
        throw fail("passkey needs -m, --tokens and --depth in [0, 1]");
    }
    model_ctx m;
    load(m, a, a.tokens + 64);
    const std::string key = "68431";
    const std::string intro = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                              "it. I will quiz you about the important information there.\n";
    const std::string filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
                               "again.\n";
    const std::string needle = "The pass key is " + key + ". Remember it. " + key + " is the pass key.\n";
    const std::string question = "What is the pass key? The pass key is";
    const long fill_tokens = long(tokenize(m.vocab, filler, false).size());
    const long fixed = long(tokenize(m.vocab, intro + needle + question, true).size());
    const long n_fill = std::max<long>(1, (a.tokens - fixed) / fill_tokens);
    const long before = std::lround(a.depth * double(n_fill));
    std::string prompt = intro;
    for (long i = 0; i < n_fill; ++i) {
        if (i == before) prompt += needle;
        prompt += filler;
    }
    if (before >= n_fill) prompt += needle;
    prompt += question;
    std::vector<llama_token> ids = tokenize(m.vocab, prompt, true);
    decode_range(m.ctx, ids, 0, long(ids.size()), a.ubatch);
    std::string answer;
    const int nv = llama_vocab_n_tokens(m.vocab);
    for (int step = 0; step < 8; ++step) {
        const llama_token t = argmax(llama_get_logits_ith(m.ctx, -1), nv);
        char piece[64];
        const int len = llama_token_to_piece(m.vocab, t, piece, sizeof piece, 0, false);
        if (len > 0) answer.append(piece, size_t(len));
        ids.push_back(t);
        decode_range(m.ctx, ids, long(ids.size()) - 1, long(ids.size()), 1);
    }
    const bool pass = answer.find(key) != std::string::npos;
    std::printf("prompt_tokens %zu depth %.2f answer \"%s\" pass %d rattn %s\n", ids.size() - 8, a.depth,
                answer.c_str(), pass ? 1 : 0, std::getenv("RATTN_PLAN") ? "on" : "off");
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    try {
        const args a = parse(argc, argv);
        if (a.pos.empty()) throw fail("usage: rattn-llama-eval eval|compare|passkey ... (see the source's header)");
        llama_backend_init();
        if (std::getenv("RATTN_EVAL_QUIET")) {
            llama_log_set([](ggml_log_level level, const char * text, void *) {
                if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
            }, nullptr);
        }
        int rc;
        if (a.pos[0] == "eval") rc = run_eval(a);
        else if (a.pos[0] == "compare") rc = run_compare(a);
        else if (a.pos[0] == "passkey") rc = run_passkey(a);
        else throw fail("unknown command '" + a.pos[0] + "'");
        llama_backend_free();
        return rc;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "rattn-llama-eval: error: %s\n", e.what());
        return 1;
    }
}
