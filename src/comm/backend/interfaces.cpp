#include "comm/backend/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <sstream>

#include "ddp/errors.h"

namespace ddp::detail {
namespace {

std::string to_text(const sockaddr* sa) {
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  return buf;
}

uint32_t to_number(const std::string& text) {
  in_addr a{};
  if (::inet_pton(AF_INET, text.c_str(), &a) != 1) return 0;
  return ntohl(a.s_addr);
}

}  // namespace

std::vector<Ipv4Interface> local_ipv4_interfaces() {
  std::vector<Ipv4Interface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_netmask) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    out.push_back({i->ifa_name, to_text(i->ifa_addr), to_text(i->ifa_netmask)});
  }
  ::freeifaddrs(list);
  return out;
}

std::string encode_interfaces(const std::vector<Ipv4Interface>& interfaces) {
  std::string s;
  for (const auto& i : interfaces) s += i.name + " " + i.address + " " + i.netmask + ";";
  return s;
}

std::vector<Ipv4Interface> decode_interfaces(const std::string& text) {
  std::vector<Ipv4Interface> out;
  std::istringstream items(text);
  std::string item;
  while (std::getline(items, item, ';')) {
    std::istringstream fields(item);
    Ipv4Interface i;
    if (fields >> i.name >> i.address >> i.netmask) out.push_back(i);
  }
  return out;
}

MasterRoute choose_master_route(const std::vector<std::vector<Ipv4Interface>>& per_rank) {
  const auto describe = [](const std::vector<Ipv4Interface>& list) {
    std::string s;
    for (const auto& i : list) s += (s.empty() ? "" : ", ") + i.name + " " + i.address + "/" + i.netmask;
    return s.empty() ? std::string("none") : s;
  };
  const std::vector<Ipv4Interface> none;
  const auto& zero = per_rank.empty() ? none : per_rank[0];
  std::vector<int> unreachable_by_first;
  for (const auto& candidate : zero) {
    const uint32_t mask = to_number(candidate.netmask);
    const uint32_t net = to_number(candidate.address) & mask;
    MasterRoute route{candidate.address, {candidate.name}};
    std::vector<int> unreachable;
    for (size_t r = 1; r < per_rank.size(); ++r) {
      std::string found;
      for (const auto& theirs : per_rank[r])
        if ((to_number(theirs.address) & mask) == net) {
          found = theirs.name;
          break;
        }
      if (found.empty()) unreachable.push_back(static_cast<int>(r));
      route.interfaces.push_back(found);
    }
    if (unreachable.empty()) return route;
    if (&candidate == &zero.front()) unreachable_by_first = unreachable;
  }
  std::string ranks;
  for (size_t k = 0; k < unreachable_by_first.size() && k < 8; ++k)
    ranks += (k ? ", " : "") + std::to_string(unreachable_by_first[k]);
  throw CommError("no IPv4 subnet joins every rank to rank 0, so rank 0's address cannot be learned: rank 0 has " +
                  describe(zero) +
                  (ranks.empty() ? std::string() : "; on the first of them rank(s) " + ranks + " have no address") +
                  ". Pass rank 0's address yourself: mpirun -x MASTER_ADDR=<address of rank 0's host> "
                  "(and GLOO_SOCKET_IFNAME=<interface> where hosts have several)");
}

}  // namespace ddp::detail
