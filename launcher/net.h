// Small socket helpers for the launcher: free ports, "is this host me?",
// the local address other nodes can reach, and an interruptible wait for a
// listening port (TCPStore's own connect loop cannot be interrupted).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace ddprun {

// A free port, reserved for the rest of ddprun's life (src/runtime/
// reserved_port.h): no other process's bind(0) or outgoing connect draws it,
// while the workers' TCPStore (which sets SO_REUSEADDR, as c10d's does) can
// listen on it. torchrun closes its probe socket and lets any process take
// the port before rank 0 binds.
uint16_t free_port();

// Empty if `port` can be bound for listening on all local addresses; else
// the reason (strerror), e.g. "Address already in use".
std::string port_unavailable_reason(uint16_t port);

// True when `host` resolves to an address of this machine (can be bound).
bool is_local_host(const std::string& host);

// The local address the kernel would use to reach host:port ("" if unknown):
// the address other nodes can most likely reach this node at.
std::string local_address_toward(const std::string& host, uint16_t port);

std::string this_hostname();

// One connection attempt to every address of host:port (at most 1 s each):
// whether one was accepted; `last_error` tells why not.
bool accepts_connections(const std::string& host, uint16_t port, std::string& last_error);

// Waits until host:port accepts TCP connections. Calls `tick` between tries
// (it may throw to abort). Returns false when `deadline` passes first;
// `last_error` tells why the last try failed.
bool wait_until_listening(const std::string& host, uint16_t port,
                          std::chrono::steady_clock::time_point deadline,
                          const std::function<void()>& tick, std::string& last_error);

}  // namespace ddprun
