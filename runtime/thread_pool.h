#pragma once
// A fixed set of worker threads running parallel loops. Many threads may call
// parallel_for at once (one per sequence): each call is one job; workers and
// the calling thread claim its iterations, and the call returns when all of
// them have run. The calling thread always takes part, so a loop progresses
// even when every worker is busy with other jobs.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rattn {

class ThreadPool {
 public:
  // `threads` counts the caller: threads - 1 workers are started (0 = hardware).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return int(workers_.size()) + 1; }

  // Runs body(i) for i in [0, n). The first exception thrown by a body is
  // rethrown here after every claimed iteration has finished.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

 private:
  struct Job;
  void worker_loop();
  static void run_iterations(Job& job);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job*> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace rattn
