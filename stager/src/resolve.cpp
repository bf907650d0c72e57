#include "resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace monarch {

// The threads share the state, which lives as long as the last of them: one
// still in a lookup after the deadline writes into memory it owns.
// Not getaddrinfo_a: its helper thread may still touch a request after
// gai_error reports it done (__gai_notify), so freeing the request races.
std::map<std::string, std::string> resolve_nodes(const std::vector<std::string>& names,
                                                 unsigned timeout_ms) {
  struct Results {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> names;
    std::vector<std::string> address;  // "" until resolved or failed
    size_t next = 0, done = 0;         // the next name to look up, names looked up
    bool late = false;                 // past the deadline: look up no more
  };
  auto results = std::make_shared<Results>();
  results->names = names;
  results->address.resize(names.size());
  auto lookups = [results] {
    std::unique_lock lock(results->mu);
    while (!results->late && results->next < results->names.size()) {
      size_t i = results->next++;
      lock.unlock();
      addrinfo hints{}, *res = nullptr;
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      std::string text;
      if (getaddrinfo(results->names[i].c_str(), nullptr, &hints, &res) == 0 && res) {
        char buf[INET_ADDRSTRLEN];
        auto* a = reinterpret_cast<sockaddr_in*>(res->ai_addr);
        if (inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) text = buf;
      }
      if (res) freeaddrinfo(res);
      lock.lock();
      results->address[i] = text;
      results->done++;
      results->cv.notify_all();
    }
  };
  size_t started = 0;
  try {
    for (; started < std::min(names.size(), kResolveThreads); ++started)
      std::thread(lookups).detach();
  } catch (const std::system_error& e) {  // no thread more: those started do the rest
    spdlog::warn("looking up the job's nodes with {} threads: {}", started, e.what());
  }
  std::map<std::string, std::string> out;
  std::unique_lock lock(results->mu);
  if (started > 0)
    results->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [&] { return results->done == names.size(); });
  results->late = true;
  for (size_t i = 0; i < names.size(); ++i)
    if (!results->address[i].empty()) out[names[i]] = results->address[i];
  return out;
}

}  // namespace monarch
