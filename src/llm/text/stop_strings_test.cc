#include "llm/text/stop_strings.h"

#include <gtest/gtest.h>

namespace sluice::llm {
namespace {

TEST(StopStringMatcherTest, TextBeforeTheFirstStopIsKept) {
  StopStringMatcher m({"END", "stop"});
  EXPECT_EQ(m.Add("hello ").text, "hello ");
  StopStringMatcher::Released r = m.Add("world stop here END");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "world ");
  EXPECT_EQ(r.stop, "stop");          // The one found first in the text, not in the list.
  EXPECT_EQ(m.Add("more").text, "");  // Nothing after a stop.
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringMatcherTest, APossibleStartIsHeldUntilSettled) {
  StopStringMatcher m({"</end>"});
  StopStringMatcher::Released r = m.Add("abc</e");
  EXPECT_EQ(r.text, "abc");
  EXPECT_FALSE(r.stopped);
  r = m.Add("x");  // Not the stop string after all: released whole.
  EXPECT_EQ(r.text, "</ex");
  r = m.Add("</en");
  EXPECT_EQ(r.text, "");
  r = m.Add("d>tail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop, "</end>");
  EXPECT_EQ(r.text, "");
}

TEST(StopStringMatcherTest, TheEndReleasesWhatWasHeld) {
  StopStringMatcher m({"###"});
  EXPECT_EQ(m.Add("a#").text, "a");
  EXPECT_EQ(m.Add("#").text, "");
  EXPECT_EQ(m.Flush(), "##");
}

TEST(StopStringMatcherTest, NoStopsHoldNothing) {
  StopStringMatcher m({"", {}});
  EXPECT_EQ(m.Add("any text").text, "any text");
  EXPECT_EQ(m.Flush(), "");
}

}  // namespace
}  // namespace sluice::llm
