// The choice of the subnet through which an mpirun job without MASTER_ADDR
// reaches rank 0 (src/comm/backend/interfaces.h).
#include "comm/backend/interfaces.h"

#include <gtest/gtest.h>

#include "ddp/errors.h"

using ddp::detail::choose_master_route;
using ddp::detail::Ipv4Interface;

TEST(MasterRoute, FirstOfRankZerosSubnetsThatHoldsEveryRank) {
  // Rank 0's first interface (a management network) does not reach rank 2;
  // its second one (the cluster network) reaches everyone.
  std::vector<std::vector<Ipv4Interface>> ranks = {
      {{"eth0", "192.168.1.10", "255.255.255.0"}, {"ib0", "10.0.0.1", "255.255.0.0"}},
      {{"eth0", "192.168.1.11", "255.255.255.0"}, {"ib0", "10.0.3.7", "255.255.0.0"}},
      {{"ib0", "10.0.9.9", "255.255.0.0"}, {"docker0", "172.17.0.1", "255.255.0.0"}}};
  const auto route = choose_master_route(ranks);
  EXPECT_EQ(route.master_addr, "10.0.0.1");
  EXPECT_EQ(route.interfaces, (std::vector<std::string>{"ib0", "ib0", "ib0"}));
}

TEST(MasterRoute, EachRankBindsItsOwnInterfaceOnTheSubnet) {
  std::vector<std::vector<Ipv4Interface>> ranks = {{{"eth0", "10.1.2.1", "255.255.255.0"}},
                                                   {{"enp1s0", "10.1.2.2", "255.255.255.0"}},
                                                   {{"veth9", "10.1.2.200", "255.255.255.0"}}};
  const auto route = choose_master_route(ranks);
  EXPECT_EQ(route.master_addr, "10.1.2.1");
  EXPECT_EQ(route.interfaces, (std::vector<std::string>{"eth0", "enp1s0", "veth9"}));
}

TEST(MasterRoute, NoCommonSubnetNamesRankZerosAddressesAndWhatToDo) {
  std::vector<std::vector<Ipv4Interface>> ranks = {{{"eth0", "10.1.2.1", "255.255.255.0"}},
                                                   {{"eth0", "10.1.3.2", "255.255.255.0"}}};
  try {
    choose_master_route(ranks);
    FAIL() << "no error";
  } catch (const ddp::CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("eth0 10.1.2.1/255.255.255.0"), std::string::npos) << what;
    EXPECT_NE(what.find("rank(s) 1"), std::string::npos) << what;
    EXPECT_NE(what.find("-x MASTER_ADDR"), std::string::npos) << what;
  }
  // Rank 0 without any interface but loopback: says so.
  try {
    choose_master_route({{}, {{"eth0", "10.1.3.2", "255.255.255.0"}}});
    FAIL() << "no error";
  } catch (const ddp::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 has none"), std::string::npos) << e.what();
  }
}

TEST(MasterRoute, ListsSurviveTheirEncoding) {
  std::vector<Ipv4Interface> list = {{"eth0", "10.1.2.1", "255.255.255.0"}, {"ib0", "10.0.0.1", "255.255.0.0"}};
  const auto back = ddp::detail::decode_interfaces(ddp::detail::encode_interfaces(list));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].name, "ib0");
  EXPECT_EQ(back[1].address, "10.0.0.1");
  EXPECT_EQ(back[1].netmask, "255.255.0.0");
  // This host's own list has no loopback.
  for (const auto& i : ddp::detail::local_ipv4_interfaces()) EXPECT_NE(i.address.rfind("127.", 0), 0u) << i.name;
}
