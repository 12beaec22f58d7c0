// Network namespaces for the launcher tests (root only): a pair of
// namespaces joined by a veth pair, one "host" each, and a way to open a TCP
// connection from inside one. Only addresses inside the namespaces a test
// creates are used; they are deleted on every path (RAII, plus a sweep of
// namespaces left by earlier test processes that died).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <random>
#include <thread>

#include "launcher_test_util.h"

namespace ddprun_test {

inline const std::string kPrefix = "ddprun_t";

inline Result run_cmd(const std::vector<std::string>& argv, const std::string& dir, double timeout = 60) {
  return Process(argv, {}, dir).wait(timeout);
}

inline std::string ip_bin() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

// Deletes namespaces named ddprun_t<pid>_* whose test process is gone.
inline void sweep_stale_namespaces(const std::string& ip, const std::string& dir) {
  std::error_code ec;
  if (!fs::exists("/run/netns", ec)) return;
  for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    pid_t owner = std::atoi(name.c_str() + kPrefix.size());
    if (owner > 0 && ::kill(owner, 0) != 0) run_cmd({ip, "netns", "del", name}, dir);
  }
}

class NetnsPair {
 public:
  NetnsPair(const std::string& ip, const std::string& dir) : ip_(ip), dir_(dir) {
    static int serial = 0;
    std::random_device rd;
    int b = 100 + static_cast<int>(rd() % 100), c = static_cast<int>(rd() % 250);
    for (int i = 0; i < 2; ++i) {
      ns[i] = kPrefix + std::to_string(::getpid()) + "_" + std::to_string(serial) + (i ? "b" : "a");
      veth[i] = "dv" + std::to_string(::getpid() % 100000) + std::to_string(serial % 10) + (i ? "b" : "a");
      addr[i] = "10." + std::to_string(b) + "." + std::to_string(c) + "." + std::to_string(i + 1);
    }
    ++serial;
  }
  ~NetnsPair() { remove(); }
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  // Empty on success, else what failed.
  std::string create() {
    Result r = run_cmd({ip_, "netns", "add", ns[0]}, dir_);
    if (r.code != 0) return "ip netns add failed: " + r.err;
    created_[0] = true;
    r = run_cmd({ip_, "netns", "add", ns[1]}, dir_);
    if (r.code != 0) return "ip netns add failed: " + r.err;
    created_[1] = true;
    // Both ends are created directly inside the namespaces: nothing of this
    // test ever appears in the host's own network namespace.
    r = run_cmd({ip_, "link", "add", veth[0], "netns", ns[0], "type", "veth", "peer", "name", veth[1], "netns", ns[1]},
                dir_);
    if (r.code != 0) return "cannot create a veth pair: " + r.err;
    for (int i = 0; i < 2; ++i) {
      for (const auto& cmd : std::vector<std::vector<std::string>>{
               {ip_, "-n", ns[i], "addr", "add", addr[i] + "/24", "dev", veth[i]},
               {ip_, "-n", ns[i], "link", "set", veth[i], "up"},
               {ip_, "-n", ns[i], "link", "set", "lo", "up"}}) {
        r = run_cmd(cmd, dir_);
        if (r.code != 0) return "network setup failed: " + r.err;
      }
    }
    return "";
  }

  void remove() {
    for (int i = 0; i < 2; ++i)
      if (created_[i]) {
        run_cmd({ip_, "netns", "del", ns[i]}, dir_);  // takes the veth end with it
        created_[i] = false;
      }
  }

  std::string ns[2], veth[2], addr[2];

 private:
  std::string ip_, dir_;
  bool created_[2] = {false, false};
};

// N namespace hosts on one switch: a bridge in a hub namespace of its own,
// and a veth pair from each host to it. unplug(i)/plug(i) take host i's
// cable out and back (its end in the hub goes down or up).
class NetnsHosts {
 public:
  NetnsHosts(const std::string& ip, const std::string& dir, int n) : ip_(ip), dir_(dir), n_(n) {
    static int serial = 0;
    std::random_device rd;
    const int b = 100 + static_cast<int>(rd() % 100), c = static_cast<int>(rd() % 250);
    const std::string tag = std::to_string(::getpid()) + "_h" + std::to_string(serial);
    hub_ = kPrefix + tag + "hub";
    for (int i = 0; i < n; ++i) {
      ns.push_back(kPrefix + tag + "n" + std::to_string(i));
      const std::string short_tag = std::to_string(::getpid() % 10000) + std::to_string(serial % 10);
      veth.push_back("dn" + short_tag + "_" + std::to_string(i));   // in the host
      hub_end_.push_back("dh" + short_tag + "_" + std::to_string(i));
      addr.push_back("10." + std::to_string(b) + "." + std::to_string(c) + "." + std::to_string(i + 1));
    }
    ++serial;
  }
  ~NetnsHosts() { remove(); }
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  // Empty on success, else what failed.
  std::string create() {
    if (Result r = run_cmd({ip_, "netns", "add", hub_}, dir_); r.code != 0) return "ip netns add failed: " + r.err;
    created_.push_back(hub_);
    for (const auto& cmd : std::vector<std::vector<std::string>>{{ip_, "-n", hub_, "link", "add", "br0", "type", "bridge"},
                                                                  {ip_, "-n", hub_, "link", "set", "br0", "up"}})
      if (Result r = run_cmd(cmd, dir_); r.code != 0) return "cannot create the bridge: " + r.err;
    for (int i = 0; i < n_; ++i) {
      if (Result r = run_cmd({ip_, "netns", "add", ns[i]}, dir_); r.code != 0) return "ip netns add failed: " + r.err;
      created_.push_back(ns[i]);
      for (const auto& cmd : std::vector<std::vector<std::string>>{
               {ip_, "link", "add", veth[i], "netns", ns[i], "type", "veth", "peer", "name", hub_end_[i], "netns", hub_},
               {ip_, "-n", hub_, "link", "set", hub_end_[i], "master", "br0"},
               {ip_, "-n", hub_, "link", "set", hub_end_[i], "up"},
               {ip_, "-n", ns[i], "addr", "add", addr[i] + "/24", "dev", veth[i]},
               {ip_, "-n", ns[i], "link", "set", veth[i], "up"},
               {ip_, "-n", ns[i], "link", "set", "lo", "up"}})
        if (Result r = run_cmd(cmd, dir_); r.code != 0) return "network setup failed: " + r.err;
    }
    return "";
  }

  bool unplug(int i) { return run_cmd({ip_, "-n", hub_, "link", "set", hub_end_[i], "down"}, dir_).code == 0; }
  bool plug(int i) { return run_cmd({ip_, "-n", hub_, "link", "set", hub_end_[i], "up"}, dir_).code == 0; }

  void remove() {
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) run_cmd({ip_, "netns", "del", *it}, dir_);
    created_.clear();
  }

  std::vector<std::string> ns, veth, addr;

 private:
  std::string ip_, dir_;
  int n_;
  std::string hub_;
  std::vector<std::string> hub_end_;
  std::vector<std::string> created_;
};

// Connects to addr:port (IPv4) from inside namespace `ns` ("" for this
// process's own), within 5 s: 0 when it connected, else the errno
// (ECONNREFUSED: nothing listens there). setns() changes only the calling
// thread, so a thread of its own enters the namespace.
inline int connect_from(const std::string& ns, const std::string& addr, uint16_t port) {
  int result = EINVAL;
  std::thread t([&] {
    if (!ns.empty()) {
      int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
        result = errno;
        if (fd >= 0) ::close(fd);
        return;
      }
      ::close(fd);
    }
    int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{5, 0};
    ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
    result = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
    ::close(s);
  });
  t.join();
  return result;
}

// Why this process cannot make namespace hosts ("" when it can try).
inline std::string netns_unavailable(const std::string& ip) {
  if (::geteuid() != 0) return "needs root to create network namespaces";
  if (ip.empty()) return "the 'ip' tool (iproute2) is not installed";
  return "";
}

// Base fixture: a fresh pair of namespace hosts (pair_) for every test, the
// processes killed before the namespaces go. Skips, saying why, without root,
// without `ip`, or where namespaces do not work; a derived SetUp checks
// IsSkipped() after calling this one.
class NetnsHostsTest : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    ip_ = ip_bin();
    if (std::string why = netns_unavailable(ip_); !why.empty()) GTEST_SKIP() << why;
    sweep_stale_namespaces(ip_, dir_);
    pair_ = std::make_unique<NetnsPair>(ip_, dir_);
    if (std::string err = pair_->create(); !err.empty()) {
      pair_.reset();
      GTEST_SKIP() << "network namespaces unavailable here: " << err;
    }
  }
  void TearDown() override {
    // Processes first (they keep namespaces alive), then the namespaces.
    kill_all_children();
    pair_.reset();
    LauncherTest::TearDown();
  }

  std::string ip_;
  std::unique_ptr<NetnsPair> pair_;
};

}  // namespace ddprun_test
