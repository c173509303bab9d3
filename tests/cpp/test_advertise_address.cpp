// core/advertise_address and core/port_range: the address a wildcard bind advertises (each
// branch of the rule, on a described host) and the port ranges listeners accept.
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "core/advertise_address.h"
#include "core/port_range.h"
#include "dlslime/errors.h"

namespace dlslime {
namespace {

// lo, a docker bridge that is up, eth0 (down or up) and eth1 with the default route.
HostInterfaces sample(bool eth0_up = true, std::string default_route = "eth1") {
  HostInterfaces h;
  h.addresses = {{"lo", "127.0.0.1", true, true},
                 {"docker0", "172.17.0.1", true, false},
                 {"eth0", "10.0.0.5", eth0_up, false},
                 {"eth1", "10.1.0.5", true, false}};
  h.default_route = std::move(default_route);
  return h;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(AdvertiseAddress, ASpecificBindIsAdvertisedAsIs) {
  const auto c = choose_advertise_address("10.0.0.5", "", "eth1", "opt", sample());
  EXPECT_EQ(c.host, "10.0.0.5");
  EXPECT_FALSE(c.loopback_fallback);
  EXPECT_EQ(choose_advertise_address("127.0.0.1", "", "", "opt", sample()).host, "127.0.0.1");
}

TEST(AdvertiseAddress, AWildcardBindFollowsTheOptionsThenTheDefaultRoute) {
  for (const char* wildcard : {"0.0.0.0", "::", ""}) {
    EXPECT_EQ(choose_advertise_address(wildcard, "gpu-node-7", "", "opt", sample()).host, "gpu-node-7");
    EXPECT_EQ(choose_advertise_address(wildcard, "", "eth0", "opt", sample()).host, "10.0.0.5");
    const auto c = choose_advertise_address(wildcard, "", "", "opt", sample());
    EXPECT_EQ(c.host, "10.1.0.5") << "the default route's interface, not the first one listed";
    EXPECT_NE(c.reason.find("default route"), std::string::npos) << c.reason;
  }
}

TEST(AdvertiseAddress, WithoutADefaultRouteTheFirstUpNonLoopbackInterfaceIsAdvertised) {
  EXPECT_EQ(choose_advertise_address("0.0.0.0", "", "", "opt", sample(true, "")).host, "172.17.0.1");
  // A default route through an interface without an IPv4 address falls through the same way.
  EXPECT_EQ(choose_advertise_address("0.0.0.0", "", "", "opt", sample(true, "wg0")).host, "172.17.0.1");
  HostInterfaces h = sample(false, "eth0");  // the default route's interface is down
  h.addresses.erase(h.addresses.begin() + 1);
  EXPECT_EQ(choose_advertise_address("0.0.0.0", "", "", "opt", h).host, "10.1.0.5");
}

TEST(AdvertiseAddress, LoopbackIsAdvertisedOnlyWhenNothingElseIsUpAndSaysSo) {
  HostInterfaces h;
  h.addresses = {{"lo", "127.0.0.1", true, true}, {"eth0", "10.0.0.5", false, false}};
  const auto c = choose_advertise_address("0.0.0.0", "", "", "opt", h);
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_TRUE(c.loopback_fallback);
  EXPECT_FALSE(choose_advertise_address("0.0.0.0", "", "lo", "opt", h).loopback_fallback)
      << "loopback asked for by name is no fallback";
}

TEST(AdvertiseAddress, AMissingOrDownInterfaceIsAnErrorListingTheInterfaces) {
  const std::string missing = error_of([] { choose_advertise_address("0.0.0.0", "", "ib0", "the option", sample()); });
  EXPECT_NE(missing.find("the option 'ib0' does not exist"), std::string::npos) << missing;
  EXPECT_NE(missing.find("eth1 10.1.0.5"), std::string::npos) << missing;
  const std::string down =
      error_of([] { choose_advertise_address("0.0.0.0", "", "eth0", "the option", sample(false)); });
  EXPECT_NE(down.find("'eth0' is down"), std::string::npos) << down;
}

TEST(AdvertiseAddress, TheRealHostHasLoopbackAndTheRuleAnswers) {
  const HostInterfaces h = HostInterfaces::read();
  bool lo = false;
  for (const auto& a : h.addresses) lo = lo || (a.loopback && a.address == "127.0.0.1");
  EXPECT_TRUE(lo);
  EXPECT_EQ(choose_advertise_address("0.0.0.0", "", "lo", "opt").host, "127.0.0.1");
}

TEST(AdvertiseAddress, InterfaceNamesAreCheckedAsText) {
  EXPECT_NO_THROW(check_interface_name("enp1s0f0np0", "opt"));
  EXPECT_THROW(check_interface_name("", "opt"), InvalidArgumentError);
  EXPECT_THROW(check_interface_name("a-name-of-16-byt", "opt"), InvalidArgumentError);
  EXPECT_THROW(check_interface_name("eth 0", "opt"), InvalidArgumentError);
  EXPECT_THROW(check_interface_name("../x", "opt"), InvalidArgumentError);
}

TEST(PortRange, ParsesRangesAndSinglePorts) {
  const PortRange r = PortRange::parse("20000-20100", "opt");
  EXPECT_EQ(r.first, 20000);
  EXPECT_EQ(r.last, 20100);
  EXPECT_EQ(r.size(), 101u);
  EXPECT_TRUE(r.contains(20000) && r.contains(20100) && !r.contains(20101) && !r.contains(19999));
  EXPECT_EQ(r.to_string(), "20000-20100");
  EXPECT_EQ(PortRange::parse("5000", "opt").to_string(), "5000");
  EXPECT_EQ(PortRange::parse("5000", "opt").size(), 1u);
  EXPECT_TRUE(PortRange::parse("", "opt").empty());
  EXPECT_EQ(PortRange::parse("1-65535", "opt").size(), 65535u);
}

TEST(PortRange, RejectsWhatIsNotARange) {
  for (const char* bad : {"0-10", "10-5", "1-65536", "abc", "10-", "-10", "10-20-30", " 10-20", "10 - 20", "99999",
                          "+5", "0x10"}) {
    const std::string e = error_of([&] { PortRange::parse(bad, "TcpEndpoint option port_range"); });
    EXPECT_NE(e.find("TcpEndpoint option port_range"), std::string::npos) << "'" << bad << "': " << e;
  }
}

}  // namespace
}  // namespace dlslime
