// One negative test per diagnostic of the DSL front end. Each case marks the
// position the error must point at with '$' (removed before parsing) and gives
// a piece of the message that must follow "file:line:col: error: ".
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "dsl/dsl.h"

namespace {

struct Case {
  const char* name;
  const char* source;   // with one '$' at the expected error position
  const char* message;  // must occur in the first line of the message
};

// A valid model block to build plan/target cases on.
#define MODEL "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }\n"

const Case kCases[] = {
    // ---- lexer ----
    {"underscore_not_between_digits", MODEL "plan { sinks = 12$_; }", "'_' in a number must sit between two digits"},
    {"letter_after_number", MODEL "plan { sinks = 12$k; }", "unexpected 'k' after the number '12'"},
    {"real_out_of_range", MODEL "plan { kernel.a = $1e999; }", "number '1e999' is out of range"},
    {"integer_overflow", MODEL "plan { sinks = $99999999999999999999; }", "is too large (at most 9223372036854775807)"},
    {"unterminated_string", "model $\"M { layers = 4; }", "unterminated string"},
    {"unknown_escape", "model \"M$\\q\" {}", "unknown escape in string"},
    {"control_char_in_string", "model \"M$\x01\" {}", "unexpected byte 0x01 inside a string"},
    {"unexpected_character", "model \"M\" { layers $@ 4; }", "unexpected character '@'"},
    {"non_ascii_character", "$\xc3\xa9", "unexpected character byte 0xC3"},
    // ---- parser: structure ----
    {"top_level_expected", "$layers = 4;", "expected 'model', 'plan' or 'target' at the top level, got 'layers'"},
    {"top_level_suggestion", "$modle \"M\" {}", "did you mean 'model'?"},
    {"duplicate_block", MODEL "plan {}\n$plan {}", "duplicate 'plan' block (the first is at 2:1)"},
    {"model_name_expected", "model ${ layers = 4; }", "expected the model's name as a string after 'model'"},
    {"model_brace_expected", "model \"M\" $layers = 4;", "expected '{' to open the model block, got 'layers'"},
    {"plan_brace_expected", MODEL "plan $sinks = 4;", "expected '{' to open the plan block"},
    {"target_brace_expected", MODEL "target $gpu = none;", "expected '{' to open the target block"},
    {"key_expected", "model \"M\" { $4 = 4; }", "expected a key or '}' to close the model block, got the number 4"},
    {"unclosed_block", "model \"M\" { layers = 4;\n$", "expected a key or '}' to close the model block, got end of file"},
    {"unknown_key_suggestion", "model \"M\" { $layer = 4; }", "unknown key 'layer' in the model block; did you mean 'layers'?"},
    {"unknown_key_list", "model \"M\" { $colour = 4; }", "unknown key 'colour' in the model block (expected one of: source, layers"},
    {"duplicate_key", "model \"M\" { layers = 4;\n  $layers = 8; }", "duplicate key 'layers' in the model block (first set at 1:13)"},
    {"equals_expected", "model \"M\" { layers $4; }", "expected '=' after 'layers', got the number 4"},
    {"number_expected", "model \"M\" { layers = $\"four\"; }", "expected a number for 'layers', got a string"},
    {"string_expected", "model \"M\" { source = $hf; }", "expected a string for 'source', got 'hf'"},
    {"semicolon_expected", "model \"M\" { layers = 4 $q_heads = 8; }", "expected ';' after the value of 'layers', got 'q_heads'"},
    {"dtype_name_expected", "model \"M\" { kv_dtype = $16; }", "expected a name or a string for 'kv_dtype'"},
    // ---- parser: rope_base block ----
    {"rope_unknown_key", "model \"M\" { rope_base { $glob = 1e6; } }", "unknown key 'glob' in the rope_base block; did you mean 'global'?"},
    {"rope_duplicate_key", "model \"M\" { rope_base { local = 1; $local = 2; } }", "duplicate key 'local' in the rope_base block"},
    {"rope_and_block_duplicate", "model \"M\" { rope_base = 1e4; $rope_base { global = 1e6; } }", "duplicate key 'rope_base'"},
    // ---- parser: layer pattern ----
    {"repeat_bracket_expected", "model \"M\" { pattern = repeat $global; }", "expected '[' after 'repeat'"},
    {"repeat_with_count", "model \"M\" { pattern = repeat [global] x $2; }", "'repeat [...]' fills all layers"},
    {"pattern_separator_expected", "model \"M\" { pattern = global $global; }", "expected ',' or ';' after a layer pattern item, got 'global'"},
    {"pattern_group_separator_expected", "model \"M\" { pattern = [global $; }", "expected ',' or ']' in the layer pattern, got ';'"},
    {"pattern_kind_expected", "model \"M\" { pattern = $sliding(4); }", "expected a layer kind ('global', 'local(W)' or '[...]')"},
    {"local_paren_expected", "model \"M\" { pattern = local $512; }", "expected '(' after 'local'"},
    {"local_close_paren_expected", "model \"M\" { pattern = local(512 $x 4; }", "expected ')' after the window of 'local'"},
    {"local_window_number_expected", "model \"M\" { pattern = local($w); }", "expected a number for the window of 'local'"},
    {"repeat_count_expected", "model \"M\" { pattern = global x $four; }", "expected a whole repeat count after 'x'"},
    {"repeat_count_zero", "model \"M\" { pattern = global x $0; }", "repeat count must be at least 1, got 0"},
    {"repeat_count_glued_too_large", "model \"M\" { pattern = global x$9999999999999999999; }", "repeat count '9999999999999999999' is too large"},
    {"pattern_too_deep", "model \"M\" { pattern = [[[[[[[[[[[[[[[[$[global]]]]]]]]]]]]]]]]]; }", "nested too deeply"},
    // ---- parser: plan and target ----
    {"plan_dotted_name_expected", MODEL "plan { kernel.cuda.$4 = 1; }", "expected a name after '.' in the key 'kernel.cuda.'"},
    {"plan_kernel_without_knob", MODEL "plan { kernel $= 1; }", "expected '.' and a knob name after 'kernel'"},
    {"plan_unknown_key", MODEL "plan { $topk = 100; }", "unknown key 'topk' in the plan block; did you mean 'top_k'?"},
    {"plan_duplicate_key", MODEL "plan { kernel.cuda.splits = 1; $kernel.cuda.splits = 2; }", "duplicate key 'kernel.cuda.splits' in the plan block"},
    {"plan_value_expected", MODEL "plan { sinks = $all; }", "expected a number, a range 'lo..hi [step s]' or a set '{a, b, ...}' for 'sinks'"},
    {"plan_range_upper_expected", MODEL "plan { sinks = 1..$; }", "expected a number for the upper end of the range of 'sinks'"},
    {"plan_step_number_expected", MODEL "plan { sinks = 1..4 step $two; }", "expected a number for the step of 'sinks'"},
    {"plan_set_separator_expected", MODEL "plan { sinks = {1, 2 $3}; }", "expected ',' or '}' in the set of 'sinks'"},
    {"plan_empty_set", MODEL "plan { sinks = {$}; }", "expected a number for a member of the set of 'sinks', got '}'"},
    {"plan_default_number_expected", MODEL "plan { sinks = {1, 2} default $x; }", "expected a number for the default of 'sinks'"},
    {"target_unknown_key", MODEL "target { $gpus = none; }", "unknown key 'gpus' in the target block; did you mean 'gpu'?"},
    {"target_value_expected", MODEL "target { gpu = $90; }", "expected a name or a string for 'gpu'"},
    // ---- semantic checks: model ----
    {"no_model_block", "$plan { sinks = 4; }", "expected a 'model' block; the file has none"},
    {"empty_file", "$", "expected a 'model' block; the file has none"},
    {"empty_model_name", "model $\"\" { }", "the model's name must not be empty"},
    {"missing_layers", "$model \"M\" { q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }", "the model block is missing 'layers'"},
    {"missing_q_heads", "$model \"M\" { layers = 4; kv_heads = 2; head_dim = 128; context = 4096; }", "the model block is missing 'q_heads'"},
    {"missing_kv_heads", "$model \"M\" { layers = 4; q_heads = 8; head_dim = 128; context = 4096; }", "the model block is missing 'kv_heads'"},
    {"missing_head_dim", "$model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; context = 4096; }", "the model block is missing 'head_dim'"},
    {"missing_context", "$model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; }", "the model block is missing 'context'"},
    {"layers_not_whole", "model \"M\" { layers = $4.5; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }", "'layers' must be a whole number, got 4.5"},
    {"layers_zero", "model \"M\" { layers = $0; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }", "'layers' must be between 1 and 1024, got 0"},
    {"layers_too_many", "model \"M\" { layers = $2000; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }", "'layers' must be between 1 and 1024, got 2000"},
    {"q_heads_negative", "model \"M\" { layers = 4; q_heads = $-8; kv_heads = 2; head_dim = 128; context = 4096; }", "'q_heads' must be between 1 and 1024, got -8"},
    {"kv_heads_zero", "model \"M\" { layers = 4; q_heads = 8; kv_heads = $0; head_dim = 128; context = 4096; }", "'kv_heads' must be between 1 and 1024, got 0"},
    {"heads_not_divisible", "model \"M\" { layers = 4; q_heads = 28; kv_heads = $5; head_dim = 128; context = 4096; }", "q_heads (28) must be a multiple of kv_heads (5)"},
    {"unsupported_head_dim", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = $80; context = 4096; }", "unsupported head_dim 80 (expected 64, 96, 128 or 256)"},
    {"context_too_large", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = $8589934592; }", "'context' must be between 1 and 4294967296"},
    {"unknown_kv_dtype", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; kv_dtype = $f8; }", "unknown kv_dtype 'f8' (expected f16, bf16 or f32)"},
    {"unknown_rope_style", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096;\n  rope_style = $llama; }", "unknown rope_style 'llama' (expected neox: pairs (i, i + d/2), or gptj: pairs (2i, 2i + 1))"},
    {"unknown_rope_style_string", "model \"M\" { rope_style = $\"NeoX\"; layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }", "unknown rope_style 'NeoX'"},
    {"rope_style_name_expected", "model \"M\" { rope_style = $2; }", "expected a name or a string for 'rope_style', got the number 2"},
    {"rope_style_duplicate", "model \"M\" { rope_style = neox; $rope_style = gptj; }", "duplicate key 'rope_style' in the model block (first set at 1:13)"},
    {"rope_style_misspelled", "model \"M\" { $rope_stile = gptj; }", "did you mean 'rope_style'?"},
    {"rope_base_not_positive", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; rope_base = $0; }", "'rope_base' must be positive, got 0"},
    {"rope_local_not_positive", "model \"M\" { layers = 2; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = local(8), global; rope_base { global = 1e6; local = $-1; } }", "'rope_base.local' must be positive, got -1"},
    {"rope_local_without_global", "model \"M\" { layers = 2; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = local(8), global; rope_base { local = $1e4; } }", "the rope_base block sets 'local' but not 'global'"},
    {"rope_local_without_local_layers", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; rope_base { global = 1e6; local = $1e4; } }", "'rope_base.local' is set but the pattern has no local layers"},
    {"local_window_zero", "model \"M\" { layers = 1; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = local($0); }", "the window of 'local' must be between 1 and"},
    {"local_window_not_whole", "model \"M\" { layers = 1; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = local($0.5); }", "the window of 'local' must be a whole number"},
    {"local_window_not_below_context", "model \"M\" { layers = 1; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = local($4096); }", "sliding window 4096 must be less than the context (4096)"},
    {"pattern_too_short", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = $local(8) x 2, global; }", "the layer pattern expands to 3 layers but 'layers' is 4"},
    {"pattern_too_long", "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = $[global x 1000] x 1000000; }", "expands to more than 1024 layers but 'layers' is 4"},
    {"repeat_does_not_divide", "model \"M\" { layers = 26; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = $repeat [local(8) x 5, global]; }", "the repeated pattern has 6 layers, which does not divide 'layers' (26)"},
    // ---- semantic checks: plan ----
    {"plan_int_not_whole", MODEL "plan { sinks = $1.5; }", "'sinks' must be a whole number, got 1.5"},
    {"plan_sinks_negative", MODEL "plan { sinks = $-1; }", "'sinks' must be between 0 and 2147483647, got -1"},
    {"plan_window_zero", MODEL "plan { window = $0; }", "'window' must be between 1 and"},
    {"plan_top_k_zero", MODEL "plan { top_k = $0; }", "'top_k' must be between 1 and"},
    {"plan_graph_degree_too_large", MODEL "plan { graph_degree = 8..$2000 step 8; }", "'graph_degree' must be between 2 and 1024, got 2000"},
    {"plan_query_neighbors_zero", MODEL "plan { query_neighbors = {$0, 10}; }", "'query_neighbors' must be between 1 and"},
    {"plan_search_queue_too_large", MODEL "plan { search_queue = $3000000000; }", "'search_queue' must be between 1 and 2147483647"},
    {"plan_build_sample_zero", MODEL "plan { build_sample = $0; }", "'build_sample' must be in (0, 1], got 0"},
    {"plan_build_sample_above_one", MODEL "plan { build_sample = 0.5..$1.5 step 0.5; }", "'build_sample' must be in (0, 1], got 1.5"},
    {"plan_key_metric_three", MODEL "plan { key_metric = $3; }", "'key_metric' must be between 0 and 2, got 3"},
    {"plan_key_metric_not_whole", MODEL "plan { key_metric = {0, $1.5}; }", "'key_metric' must be a whole number, got 1.5"},
    {"plan_causal_not_switch", MODEL "plan { causal = $2; }", "'causal' must be between 0 and 1, got 2"},
    {"plan_two_hop_fill_not_switch", MODEL "plan { two_hop_fill = 0..$2; }", "'two_hop_fill' must be between 0 and 1, got 2"},
    {"plan_repair_fraction_above_one", MODEL "plan { repair_fraction = 0..$1.5 step 0.5; }", "'repair_fraction' must be in [0, 1], got 1.5"},
    {"plan_repair_fraction_negative", MODEL "plan { repair_fraction = $-0.1; }", "'repair_fraction' must be in [0, 1], got -0.1"},
    {"plan_refresh_sample_above_one", MODEL "plan { refresh_sample = {0, $1.5}; }", "'refresh_sample' must be in [0, 1], got 1.5"},
    {"plan_refresh_sample_negative", MODEL "plan { refresh_sample = $-0.5; }", "'refresh_sample' must be in [0, 1], got -0.5"},
    {"plan_repair_fraction_range_needs_step", MODEL "plan { repair_fraction = $0..1; }", "the range of 'repair_fraction' needs a step"},
    {"plan_key_metric_ridge_zero", MODEL "plan { key_metric_ridge = $0; }", "'key_metric_ridge' must be positive"},
    {"plan_key_metric_passes_eight", MODEL "plan { key_metric_passes = $8; }", "'key_metric_passes' must be between 0 and 7, got 8"},
    {"plan_insert_queue_zero", MODEL "plan { insert_queue = $0; }", "'insert_queue' must be between 1 and 1048576, got 0"},
    {"plan_insert_pivots_zero", MODEL "plan { insert_pivots = {$0, 4}; }", "'insert_pivots' must be between 1 and"},
    {"plan_insert_reverse_negative", MODEL "plan { insert_reverse = $-1; }", "'insert_reverse' must be between 0 and"},
    {"plan_insert_key_queue_too_large", MODEL "plan { insert_key_queue = $2000000; }", "'insert_key_queue' must be between 0 and 1048576"},
    {"plan_search_patience_negative", MODEL "plan { search_patience = $-1; }", "'search_patience' must be between 0 and"},
    {"plan_search_expand_first_negative", MODEL "plan { search_expand_first = $-1; }", "'search_expand_first' must be between 0 and"},
    {"plan_search_full_expand_negative", MODEL "plan { search_full_expand = $-2; }", "'search_full_expand' must be between 0 and"},
    // ---- per-layer keys: `layer N, ... { ... }` in the plan ----
    {"layer_block_brace_expected", MODEL "plan { layer 1 $search_queue = 1; }", "expected '{' to open the layer block, got 'search_queue'"},
    {"layer_block_number_expected", MODEL "plan { layer 1, ${ } }", "expected a number for a layer number after ','"},
    {"layer_block_whole_number", MODEL "plan { layer $1.5 { } }", "a layer number must be a whole number, got 1.5"},
    {"layer_block_out_of_range", MODEL "plan { layer 2, $4 { } }", "a layer number must be between 0 and 3, got 4"},
    {"layer_block_local_layer",
     "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; pattern = repeat [local(64), global]; }\n"
     "plan { layer 1, $2 { } }",
     "layer 2 is a local(64) layer: it has no retrieval, so no per-layer retrieval keys (global layers: 1, 3)"},
    {"layer_block_model_wide_key", MODEL "plan { layer 1 { $window = 200; } }", "'window' applies to the whole model and cannot be set per layer"},
    {"layer_block_top_k_past_context", MODEL "plan { search_queue = 5000; layer 1 { top_k = $4096; } }", "'top_k' (4096) must be less than the model's context (4096)"},
    {"layer_block_top_k_above_queue", MODEL "plan { top_k = 100; search_queue = 200; layer 1 { top_k = $300; } }",
     "top_k (300) must not exceed search_queue (200)"},
    {"layer_block_top_k_above_own_queue", MODEL "plan { top_k = 100; search_queue = 2000; layer 1 { top_k = 1000; search_queue = $500; } }",
     "top_k (1000) must not exceed this search_queue (500)"},
    {"layer_block_tail_samples_range", MODEL "plan { layer 1 { tail_samples = $-1; } }", "'tail_samples' must be between 0 and"},
    {"layer_block_kernel_knob", MODEL "plan { layer 1 { $kernel.cuda.splits = 4; } }", "'kernel' applies to the whole model and cannot be set per layer"},
    {"layer_block_unknown_key", MODEL "plan { layer 1 { $search_queu = 200; } }", "unknown key 'search_queu' in the layer block; did you mean 'search_queue'?"},
    {"layer_block_duplicate_key", MODEL "plan { layer 1 { search_seeds = 4; $search_seeds = 8; } }", "duplicate key 'search_seeds' in the layer block (first set at 2:18)"},
    {"layer_block_duplicate_layer", MODEL "plan { layer 1 { } layer 2, $1 { } }", "layer 1 already has its block at 2:14"},
    {"layer_block_value_range", MODEL "plan { layer 1 { search_seeds = $-1; } }", "'search_seeds' must be between 0 and"},
    {"layer_block_queue_below_top_k", MODEL "plan { top_k = 200; search_queue = 300; layer 1 { search_queue = $100..150; } }",
     "no choice of top_k (at least 200) and this search_queue (at most 150) satisfies top_k <= search_queue"},
    {"layer_block_default_queue_below_top_k", MODEL "plan { top_k = 200; search_queue = 300; layer 1 { search_queue = $100..300 step 100; } }",
     "the default top_k (200) exceeds this layer's default search_queue (100)"},
    {"plan_search_seeds_negative", MODEL "plan { search_seeds = $-1; }", "'search_seeds' must be between 0 and 65536, got -1"},
    {"plan_search_seeds_too_large_in_set", MODEL "plan { search_seeds = {0, 16, $65537}; }", "'search_seeds' must be between 0 and 65536, got 65537"},
    {"plan_search_seeds_too_large_in_range", MODEL "plan { search_seeds = 0..$131072 step 65536; }", "'search_seeds' must be between 0 and 65536, got 131072"},
    {"plan_search_seeds_not_whole", MODEL "plan { search_seeds = $2.5; }", "'search_seeds' must be a whole number, got 2.5"},
    {"plan_search_seeds_misspelled", MODEL "plan { $search_seed = 16; }", "did you mean 'search_seeds'?"},
    {"plan_tail_samples_negative", MODEL "plan { tail_samples = $-1; }", "'tail_samples' must be between 0 and 16777216, got -1"},
    {"plan_tail_samples_negative_in_set", MODEL "plan { tail_samples = {0, $-512}; }", "'tail_samples' must be between 0 and 16777216, got -512"},
    {"plan_tail_samples_not_whole", MODEL "plan { tail_samples = $1.5; }", "'tail_samples' must be a whole number, got 1.5"},
    {"plan_tail_samples_misspelled", MODEL "plan { $tail_sample = 64; }", "did you mean 'tail_samples'?"},
    {"plan_shift_queries_negative", MODEL "plan { shift_queries = $-1; }", "'shift_queries' must be between 0 and 16777216, got -1"},
    {"plan_shift_queries_too_large_in_range", MODEL "plan { shift_queries = 0..$16777217 step 16777217; }", "'shift_queries' must be between 0 and 16777216, got 16777217"},
    {"plan_shift_queries_not_whole", MODEL "plan { shift_queries = {0, $0.5}; }", "'shift_queries' must be a whole number, got 0.5"},
    {"plan_shift_span_below_eight", MODEL "plan { shift_span = $4; }", "'shift_span' must be between 8 and 16777216, got 4"},
    {"plan_shift_span_too_large_in_set", MODEL "plan { shift_span = {2048, $33554432}; }", "'shift_span' must be between 8 and 16777216, got 33554432"},
    {"plan_shift_span_default_out_of_range", MODEL "plan { shift_span = {8, 16} default $0; }", "'shift_span' must be between 8 and 16777216, got 0"},
    {"plan_shift_span_misspelled", MODEL "plan { $shift_spam = 64; }", "did you mean 'shift_span'?"},
    {"plan_entry_points_zero", MODEL "plan { entry_points = $0; }", "'entry_points' must be between 1 and 1024, got 0"},
    {"plan_extra_slots_too_large", MODEL "plan { extra_slots = $5000; }", "'extra_slots' must be between 0 and 4096"},
    {"plan_build_queue_zero", MODEL "plan { build_queue = $0; }", "'build_queue' must be between 1 and"},
    {"plan_pivots_per_query_zero", MODEL "plan { pivots_per_query = $0; }", "'pivots_per_query' must be between 1 and 1024"},
    {"plan_pivot_capacity_zero", MODEL "plan { pivot_capacity = $0; }", "'pivot_capacity' must be between 1 and"},
    {"plan_index_key_misspelled", MODEL "plan { $key_metrc = 2; }", "did you mean 'key_metric'?"},
    {"plan_kernel_knob_too_large", MODEL "plan { kernel.cuda.splits = $1e16; }", "'kernel.cuda.splits' must be 1..64, got 1e16"},
    {"plan_kernel_unknown_backend", MODEL "plan { $kernel.foo.bar = 1; }", "unknown key 'kernel.foo.bar' in the plan block (expected one of: kernel.cuda.tile, kernel.cuda.warps, kernel.cuda.splits, kernel.cuda.vec, kernel.cuda.stages, kernel.cuda.page, kernel.halide.vector"},
    {"plan_kernel_unknown_knob", MODEL "plan { $kernel.cuda.warp = 4; }", "unknown key 'kernel.cuda.warp' in the plan block; did you mean 'kernel.cuda.warps'?"},
    {"plan_kernel_bare_backend", MODEL "plan { $kernel.cuda = 4; }", "unknown key 'kernel.cuda' in the plan block"},
    {"plan_kernel_warps_not_legal", MODEL "plan { kernel.cuda.warps = $3; }", "'kernel.cuda.warps' must be 1, 2, 4 or 8, got 3"},
    {"plan_kernel_warps_set_member", MODEL "plan { kernel.cuda.warps = {4, $6}; }", "'kernel.cuda.warps' must be 1, 2, 4 or 8, got 6"},
    {"plan_kernel_warps_range_member", MODEL "plan { kernel.cuda.warps = $1..8; }", "the range of 'kernel.cuda.warps' includes 3, which is not a legal value (1, 2, 4 or 8); e.g. write 1..8 step *2"},
    {"plan_kernel_warps_default", MODEL "plan { kernel.cuda.warps = {4, 8} default $5; }", "'kernel.cuda.warps' must be 1, 2, 4 or 8, got 5"},
    {"plan_kernel_tile_not_pow2", MODEL "plan { kernel.cuda.tile = $48; }", "'kernel.cuda.tile' must be a power of two in 8..256, got 48"},
    {"plan_kernel_vec_not_legal", MODEL "plan { kernel.cuda.vec = $16; }", "'kernel.cuda.vec' must be 2, 4 or 8 elements per load, got 16"},
    {"plan_kernel_splits_fraction", MODEL "plan { kernel.cuda.splits = $2.5; }", "'kernel.cuda.splits' must be 1..64, got 2.5"},
    {"plan_kernel_halide_unroll", MODEL "plan { kernel.halide.unroll = $17; }", "'kernel.halide.unroll' must be 0..16, got 17"},
    {"plan_kernel_halide_vector", MODEL "plan { kernel.halide.vector = $24; }", "'kernel.halide.vector' must be 0 or a power of two in 1..64 fp32 lanes, got 24"},
    {"plan_kernel_halide_parallel", MODEL "plan { kernel.halide.parallel = $2; }", "'kernel.halide.parallel' must be 0..1, got 2"},
    {"plan_default_on_fixed", MODEL "plan { sinks = 4 default $4; }", "'default' applies only to a range or a set"},
    {"plan_set_duplicate", MODEL "plan { kernel.cuda.splits = {1, 2, $2}; }", "the value 2 appears twice in the set of 'kernel.cuda.splits'"},
    {"plan_empty_range", MODEL "plan { graph_degree = $48..16 step 8; }", "empty range 48..16 for 'graph_degree'"},
    {"plan_range_needs_step", MODEL "plan { build_sample = $0.25..1.0; }", "the range of 'build_sample' needs a step"},
    {"plan_step_not_positive", MODEL "plan { graph_degree = 16..48 step $0; }", "the step of 'graph_degree' must be positive, got 0"},
    {"plan_step_not_whole", MODEL "plan { graph_degree = 16..48 step $2.5; }", "the step of 'graph_degree' must be a whole number, got 2.5"},
    {"plan_geometric_step_too_small", MODEL "plan { kernel.halide.vector = 8..32 step *$1; }", "a geometric step of 'kernel.halide.vector' must be greater than 1, got 1"},
    {"plan_geometric_from_zero", MODEL "plan { kernel.halide.vector = $0..32 step *2; }", "a geometric range of 'kernel.halide.vector' must start above 0"},
    {"plan_too_many_candidates", MODEL "plan { search_queue = $1..1000000; }", "the range of 'search_queue' has 1000000 candidates; at most 10000"},
    {"plan_default_not_candidate", MODEL "plan { graph_degree = 16..48 step 8 default $30; }", "default 30 is not one of the candidates of 'graph_degree'"},
    {"plan_window_not_below_context", MODEL "plan { sinks = 0; window = $4096; }", "'window' (4096) must be less than the model's context (4096)"},
    {"plan_sinks_window_not_below_context", MODEL "plan { sinks = $96; window = 4000; }", "sinks + window (96 + 4000) must be less than the model's context (4096)"},
    {"plan_top_k_not_below_context", MODEL "plan { top_k = $5000; search_queue = 6000; }", "'top_k' (5000) must be less than the model's context (4096)"},
    {"plan_top_k_above_search_queue", MODEL "plan { top_k = $200; search_queue = 100; }", "top_k (200) must not exceed search_queue (100)"},
    {"plan_top_k_above_default_search_queue", MODEL "plan { top_k = $200; }", "top_k (200) must not exceed search_queue (160)"},
    {"plan_no_valid_top_k_search_queue_pair", MODEL "plan { top_k = ${200, 300}; search_queue = 100..150 step 10; }", "no choice of top_k (at least 200) and search_queue (at most 150) satisfies top_k <= search_queue"},
    {"plan_code_dims_above_head_dim", MODEL "plan { code_dims = ${64, 160}; }", "'code_dims' (160 at most) must not exceed the model's head_dim (128)"},
    {"plan_code_dims_fixed_above_head_dim", MODEL "plan { code_dims = $129; }", "'code_dims' (129) must not exceed the model's head_dim (128)"},
    {"plan_code_dims_negative", MODEL "plan { code_dims = $-1; }", "'code_dims' must be between 0 and 1048576, got -1"},
    {"plan_code_coarse_dims_above_code_dims", MODEL "plan { code_dims = 64; code_coarse_dims = $80; }", "no choice of code_coarse_dims (at least 80) and code_dims (at most 64) satisfies code_coarse_dims <= code_dims"},
    {"plan_code_coarse_dims_without_code_dims", MODEL "plan { code_coarse_dims = $32; }", "no choice of code_coarse_dims (at least 32) and code_dims (at most 0)"},
    {"plan_default_code_coarse_dims_above_default_code_dims", MODEL "plan { code_dims = {48, 80} default 48; code_coarse_dims = ${0, 64} default 64; }", "the default code_coarse_dims (64) exceeds the default code_dims (48)"},
    {"plan_code_dims_misspelled", MODEL "plan { $code_dim = 80; }", "did you mean 'code_dims'?"},
    {"plan_default_top_k_above_default_search_queue", MODEL "plan { top_k = ${100, 200} default 200; search_queue = 100..300 step 20; }", "the default top_k (200) exceeds the default search_queue (100)"},
    // ---- semantic checks: target ----
    {"target_gpu_malformed", MODEL "target { gpu = $h100; }", "expected 'none' or an arch like sm_90 for 'gpu', got 'h100'"},
    {"target_gpu_too_old", MODEL "target { gpu = $sm_70; }", "gpu arch sm_70 is too old (rattn needs sm_75 or newer)"},
    {"target_cpu_empty", MODEL "target { cpu = $\"\"; }", "'cpu' must not be empty"},
};

class DslDiagnostic : public ::testing::TestWithParam<Case> {};

TEST_P(DslDiagnostic, PointsAtTheErrorAndSaysWhatWasExpected) {
  const Case& c = GetParam();
  std::string src = c.source;
  const size_t mark = src.find('$');
  ASSERT_NE(mark, std::string::npos) << "test case needs a '$' marker";
  src.erase(mark, 1);
  int line = 1, col = 1;
  for (size_t i = 0; i < mark; ++i) {
    if (src[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  try {
    rattn::parse_program(src, "case.ra");
    FAIL() << "parsed without error:\n" << src;
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::parse_error);
    const std::string msg = e.what();
    const std::string first_line = msg.substr(0, msg.find('\n'));
    const std::string prefix = "case.ra:" + std::to_string(line) + ":" + std::to_string(col) + ": error: ";
    EXPECT_EQ(first_line.rfind(prefix, 0), 0u) << "expected prefix '" << prefix << "', got: " << msg;
    EXPECT_NE(first_line.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Dsl, DslDiagnostic, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(DslDiagnosticFormat, QuotesTheSourceLineWithACaret) {
  try {
    rattn::parse_program("model \"M\" {\n  layers = 4 q_heads = 8;\n}\n", "x.ra");
    FAIL();
  } catch (const rattn::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "x.ra:2:14: error: expected ';' after the value of 'layers', got 'q_heads'\n"
              "    layers = 4 q_heads = 8;\n"
              "               ^");
  }
}

TEST(DslDiagnosticFormat, DirectoryIsAnIoError) {
  try {
    rattn::load_program(RATTN_SOURCE_DIR);
    FAIL();
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::io_error);
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

TEST(DslDiagnosticFormat, MissingFileIsAnIoError) {
  try {
    rattn::load_program("/nonexistent/dir/model.ra");
    FAIL();
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::io_error);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.ra"), std::string::npos);
  }
}

}  // namespace
