// common/: the double-buffering data manager (overlap.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/overlap.h"

namespace msaflow {
namespace {

// Waits up to 5 s for `flag`; true if it was set.
bool WaitFor(const std::atomic<bool>& flag) {
  for (int i = 0; i < 5000 && !flag; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag;
}

TEST(Overlap, FetchesTheNextItemWhileTheCurrentOneIsConsumed) {
  const int64_t n = 5;
  std::vector<std::atomic<bool>> fetched(n);
  std::vector<int64_t> order;
  std::vector<bool> next_seen_during_consume;
  OverlapStats s = Overlap(
      n, [&](int64_t i) { fetched[static_cast<size_t>(i)] = true; },
      [&](int64_t i) {
        order.push_back(i);
        EXPECT_TRUE(fetched[static_cast<size_t>(i)]);  // consumed only after it was fetched
        // fetch(i + 1) runs on the helper while we wait here, so it completes before we return.
        if (i + 1 < n) next_seen_during_consume.push_back(WaitFor(fetched[static_cast<size_t>(i + 1)]));
      },
      true);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(next_seen_during_consume, std::vector<bool>(n - 1, true));
  EXPECT_EQ(s.items, n);
}

TEST(Overlap, OffFetchesEachItemRightBeforeItsConsume) {
  std::vector<std::string> calls;
  OverlapStats s = Overlap(
      3, [&](int64_t i) { calls.push_back("f" + std::to_string(i)); },
      [&](int64_t i) { calls.push_back("c" + std::to_string(i)); }, false);
  EXPECT_EQ(calls, (std::vector<std::string>{"f0", "c0", "f1", "c1", "f2", "c2"}));
  EXPECT_EQ(s.items, 3);
  EXPECT_DOUBLE_EQ(s.wait_s, s.fetch_s);  // nothing hidden
}

TEST(Overlap, HidesFetchTimeBehindConsumeTime) {
  auto sleep_ms = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  OverlapStats on = Overlap(4, [&](int64_t) { sleep_ms(30); }, [&](int64_t) { sleep_ms(30); }, true);
  // Only the first fetch is exposed; sleeps, not CPU, so this holds on a loaded machine.
  EXPECT_LT(on.wait_s, 0.5 * on.fetch_s);
  EXPECT_GE(on.fetch_s, 4 * 0.029);
}

TEST(Overlap, AFetchErrorReachesTheCallerAndStopsTheConsumer) {
  std::vector<int64_t> consumed;
  for (bool on : {true, false}) {
    consumed.clear();
    EXPECT_THROW(Overlap(
                     4,
                     [&](int64_t i) {
                       if (i == 2) throw std::runtime_error("part 2 unreadable");
                     },
                     [&](int64_t i) { consumed.push_back(i); }, on),
                 std::runtime_error);
    EXPECT_EQ(consumed, (std::vector<int64_t>{0, 1})) << "on=" << on;
  }
}

TEST(Overlap, AConsumeErrorWaitsForTheFetchInFlight) {
  std::atomic<bool> fetch_done{false};
  EXPECT_THROW(Overlap(
                   2,
                   [&](int64_t i) {
                     if (i == 1) {
                       std::this_thread::sleep_for(std::chrono::milliseconds(50));
                       fetch_done = true;
                     }
                   },
                   [&](int64_t) { throw std::runtime_error("compute failed"); }, true),
               std::runtime_error);
  EXPECT_TRUE(fetch_done);  // the helper finished before Overlap returned
}

TEST(Overlap, TheSwitchIsReadFromTheEnvironmentAndChecked) {
  unsetenv("MSAFLOW_OVERLAP");
  EXPECT_TRUE(OverlapEnabled());
  setenv("MSAFLOW_OVERLAP", "0", 1);
  EXPECT_FALSE(OverlapEnabled());
  setenv("MSAFLOW_OVERLAP", "yes", 1);
  try {
    OverlapEnabled();
    ADD_FAILURE() << "accepted MSAFLOW_OVERLAP=yes";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("MSAFLOW_OVERLAP='yes'"), std::string::npos) << e.what();
  }
  unsetenv("MSAFLOW_OVERLAP");
}

}  // namespace
}  // namespace msaflow
