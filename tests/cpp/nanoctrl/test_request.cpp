#include <gtest/gtest.h>

#include "nanoctrl/request.h"

using dlslime::nanoctrl::ApiError;
using dlslime::nanoctrl::Fields;
using nlohmann::json;

namespace {

int status_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e.status();
  }
  return 0;
}

}  // namespace

TEST(Fields, ValidatesTypesAndNames) {
  json body = {{"s", "x"}, {"n", 5}, {"neg", -1}, {"f", 1.5}, {"b", true}, {"o", {{"k", 1}}},
               {"bad_name", "a:b"}, {"list", {"a", "b"}}, {"null", nullptr}, {"scope", "team-1"}};
  Fields f(body);
  EXPECT_EQ(f.req_string("s"), "x");
  EXPECT_EQ(f.opt_int("n"), 5);
  EXPECT_EQ(f.opt_uint("n"), 5u);
  EXPECT_EQ(f.opt_number("f"), 1.5);
  EXPECT_TRUE(f.opt_bool("b", false));
  EXPECT_FALSE(f.has("null"));
  EXPECT_FALSE(f.opt_string("null").has_value());
  EXPECT_EQ(f.scope(), "team-1");
  EXPECT_EQ(f.req_name_list("list"), (std::vector<std::string>{"a", "b"}));

  EXPECT_EQ(status_of([&] { f.req_string("missing"); }), 400);
  EXPECT_EQ(status_of([&] { f.req_string("n"); }), 400);
  EXPECT_EQ(status_of([&] { f.opt_int("s"); }), 400);
  EXPECT_EQ(status_of([&] { f.opt_uint("neg"); }), 400);
  EXPECT_EQ(status_of([&] { f.opt_bool("s", false); }), 400);
  EXPECT_EQ(status_of([&] { f.opt_object("s"); }), 400);
  EXPECT_EQ(status_of([&] { f.req_name("bad_name"); }), 400);
  EXPECT_EQ(status_of([&] { f.req_name_list("s"); }), 400);
  json bad_scope = {{"scope", "a:b"}};
  EXPECT_EQ(status_of([&] { Fields(bad_scope).scope(); }), 400);
}

TEST(Fields, NamesAndIds) {
  EXPECT_TRUE(dlslime::nanoctrl::is_valid_name("agent-1.x_y@z"));
  EXPECT_FALSE(dlslime::nanoctrl::is_valid_name(""));
  EXPECT_FALSE(dlslime::nanoctrl::is_valid_name("a b"));
  EXPECT_FALSE(dlslime::nanoctrl::is_valid_name("a*"));
  EXPECT_FALSE(dlslime::nanoctrl::is_valid_name(std::string(129, 'a')));
  EXPECT_TRUE(dlslime::nanoctrl::is_valid_id("cache:0/*"));
  EXPECT_FALSE(dlslime::nanoctrl::is_valid_id("with space"));
}
