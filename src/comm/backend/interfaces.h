// This host's IPv4 interfaces, and the choice of the subnet that joins every
// rank to rank 0: how a multi-node mpirun job without MASTER_ADDR learns rank
// 0's address (process_group_mpi.cpp gathers the lists over MPI). Torch-free
// and MPI-free, so the choice is a pure function with its own unit test.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::detail {

struct Ipv4Interface {
  std::string name;     // "eth0"
  std::string address;  // "10.1.2.3"
  std::string netmask;  // "255.255.255.0"
};

// The interfaces that are up, not loopback, with an IPv4 address, in the
// order getifaddrs lists them.
std::vector<Ipv4Interface> local_ipv4_interfaces();

// "eth0 10.1.2.3 255.255.255.0;..." and back, to send a list over MPI.
std::string encode_interfaces(const std::vector<Ipv4Interface>& interfaces);
std::vector<Ipv4Interface> decode_interfaces(const std::string& text);

struct MasterRoute {
  std::string master_addr;              // rank 0's address on the chosen subnet
  std::vector<std::string> interfaces;  // per rank: its interface on that subnet
};

// The first of rank 0's interfaces whose subnet (its address and netmask)
// holds an address of every other rank. Throws CommError naming rank 0's
// addresses, and the ranks that reach none of them, when there is none.
MasterRoute choose_master_route(const std::vector<std::vector<Ipv4Interface>>& per_rank);

}  // namespace ddp::detail
