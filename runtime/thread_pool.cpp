#include "runtime/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>

namespace rattn {

struct ThreadPool::Job {
  const std::function<void(int64_t)>* body = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  int users = 0;  // workers inside run_iterations; guarded by the pool mutex
  std::condition_variable released;
  std::mutex error_mutex;
  std::exception_ptr error;
};

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_iterations(Job& job) {
  for (;;) {
    const int64_t i = job.next.fetch_add(1);
    if (i >= job.n) return;
    try {
      (*job.body)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    Job* job = jobs_.front();
    if (job->next.load() >= job->n) {  // fully claimed: nobody else needs it
      jobs_.pop_front();
      continue;
    }
    // Registered as a user under the lock, so the owner cannot return (and
    // destroy the job) before this worker is done with it.
    ++job->users;
    lock.unlock();
    run_iterations(*job);
    lock.lock();
    if (--job->users == 0) job->released.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& body) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  Job job;
  job.body = &body;
  job.n = n;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(&job);
  }
  wake_.notify_all();
  run_iterations(job);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = std::find(jobs_.begin(), jobs_.end(), &job);
    if (it != jobs_.end()) jobs_.erase(it);
    // Every worker that claimed an iteration is a user until it finishes.
    job.released.wait(lock, [&] { return job.users == 0; });
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace rattn
