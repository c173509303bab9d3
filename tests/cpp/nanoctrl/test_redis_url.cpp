#include <gtest/gtest.h>

#include "dlslime/errors.h"
#include "nanoctrl/redis_store.h"

using dlslime::InvalidArgumentError;
using dlslime::nanoctrl::RedisUrl;

TEST(RedisUrl, Parses) {
  auto u = RedisUrl::parse("redis://127.0.0.1:6380");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 6380);
  EXPECT_EQ(u.db, 0);
  EXPECT_TRUE(u.password.empty());

  u = RedisUrl::parse("redis://:s3cret@localhost:7000/3");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.password, "s3cret");
  EXPECT_TRUE(u.user.empty());
  EXPECT_EQ(u.db, 3);
  EXPECT_EQ(u.to_string(), "redis://:***@localhost:7000/3");

  u = RedisUrl::parse("redis://bob:pw@host");
  EXPECT_EQ(u.user, "bob");
  EXPECT_EQ(u.password, "pw");
  EXPECT_EQ(u.port, 6379);

  u = RedisUrl::parse("redis://[::1]:6390/1");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 6390);
  EXPECT_EQ(u.db, 1);
}

TEST(RedisUrl, RejectsBadUrls) {
  for (const char* bad : {"http://x:1", "127.0.0.1:6379", "redis://h:notaport", "redis://h:70000",
                          "redis://h:1/x", "redis://[::1", "rediss://h:1"}) {
    EXPECT_THROW(RedisUrl::parse(bad), InvalidArgumentError) << bad;
  }
}
