// The report's HTML and SVG, the status table's rows and the journal's time stamps: pure
// functions over JSON, no processes.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <sstream>

#include "common/clock.h"
#include "common/error.h"
#include "record/journal.h"
#include "report/progress_bar.h"
#include "record/provenance.h"
#include "report/report.h"
#include "record/status.h"
#include "report/svg.h"

namespace msaflow::report {
using namespace msaflow::record;
namespace {

using nlohmann::json;

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

json Candidate(const std::string& id, int round, double acc, const std::string& backbone = "mnv2") {
  return {{"candidate", id}, {"round", round},         {"backbone", backbone}, {"head", "softmax adam lr=1e-03"},
          {"model", "model/r/" + std::to_string(round) + "/" + id}, {"result", "result/" + id}, {"accuracy", acc},
          {"test_accuracy", acc - 0.01}, {"curve", {{"loss", {2.0, 1.0, 0.5}}}}};
}

json Provenance() {
  json r1 = {{"round", 1},
             {"tasks", json::array({{{"task", "r1-train"}, {"step", "train"}, {"module", "dam"}, {"ranks", 2},
                                     {"hosts", {"n1"}}, {"how", "ran"}, {"seconds", 1.5},
                                     {"started", "2026-11-23T10:00:00.250Z"},
                                     {"nam_bytes", {{"put", 2048}, {"got", 10}}}},
                                    {{"task", "r1-load"}, {"step", "load"}, {"module", "cm"}, {"ranks", 1},
                                     {"how", "ran"}}})},  // no start time: not drawn
             {"candidates", json::array({Candidate("r1-c00", 1, 0.8), Candidate("r1-c01", 1, 0.7, "pixels"),
                                         Candidate("r1-<c2>", 1, 0.6)})}};
  json r2 = {{"round", 2},
             {"tasks", json::array({{{"task", "r2-train"}, {"step", "train"}, {"module", "dam"}, {"ranks", 2},
                                     {"how", "done by an earlier coordinator of the run"}, {"seconds", 1.0},
                                     {"started", "2026-11-23T10:00:03Z"}}})},
             // r1-c00 kept from round 1: listed again, marked once (in round 1)
             {"candidates", json::array({Candidate("r2-c00", 2, 0.85), Candidate("r1-c00", 1, 0.8)})}};
  return {{"format", kProvenanceFormat},
          {"run", "run&1"},
          {"pipeline", "p"},
          {"rounds", {r1, r2}},
          {"champion",
           {{"candidate", "r2-c00"},
            {"accuracy", 0.85},
            {"test", {{"accuracy", 0.84}}},
            {"confusion", {{"split", "test"}, {"classes", 2}, {"matrix", {{5, 1}, {2, 7}}}}}}}};
}

TEST(Report, OneMarkPerCandidatePerRoundAndEveryPartDrawn) {
  const std::string html = RenderReport({Provenance(), json(), "finished: champion r2-c00"});
  EXPECT_EQ(Count(html, "<circle class=\"mark"), 4u);  // r1-c00, r1-c01, r1-<c2>, r2-c00
  EXPECT_EQ(Count(html, "data-round=\"1\""), 3u);
  EXPECT_EQ(Count(html, "data-round=\"2\""), 1u);
  EXPECT_EQ(Count(html, "class=\"mark champion\""), 1u);
  EXPECT_EQ(Count(html, "<rect class=\"task\""), 2u);  // r1-load has no start time
  EXPECT_NE(html.find("1 task(s) have no recorded start time"), std::string::npos);
  EXPECT_EQ(Count(html, "<polyline class=\"curve"), 4u);
  EXPECT_EQ(Count(html, "<rect class=\"cell\""), 4u);  // 2 x 2
  EXPECT_NE(html.find("class=\"best-so-far\""), std::string::npos);
  EXPECT_NE(html.find("(test split)"), std::string::npos);
  // No script, nothing fetched: the file is all there is.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

// The x of each point of a candidate's curve, from its polyline.
std::vector<double> CurveXs(const std::string& html, const std::string& id) {
  const size_t at = html.find("data-candidate=\"" + id + "\" stroke=");  // the polyline, not the mark
  const size_t from = html.find("points=\"", at) + 8, to = html.find('"', from);
  std::vector<double> xs;
  std::istringstream in(html.substr(from, to - from));
  for (std::string p; in >> p;) xs.push_back(std::stod(p.substr(0, p.find(','))));
  return xs;
}

// A halving round that held the test split back: its candidates have no test figure until a
// later round's select scores the one it keeps; the report shows that figure where the candidate
// was trained.
TEST(Report, AKeptCandidatesLaterTestFigureIsShownWhereItWasTrained) {
  json p = Provenance();
  for (json& c : p["rounds"][0]["candidates"]) c.erase("test_accuracy");
  p["rounds"][1]["candidates"][1]["test_accuracy"] = 0.7321;  // r1-c00, scored in round 2
  const std::string html = RenderReport({p, json(), "finished: champion r2-c00"});
  EXPECT_NE(html.find("<td>r1-c00</td><td>mnv2</td><td>softmax adam lr=1e-03</td><td>0.8000</td><td>0.7321</td>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<td>r1-c01</td><td>pixels</td><td>softmax adam lr=1e-03</td><td>0.7000</td><td></td>"),
            std::string::npos);
}

// A long training's curve keeps every k-th epoch and says which ("epoch"): its points are drawn
// at those epochs, on the axis of the longest training; a curve without a valid epoch list
// (older msaflow, or not ascending) is drawn one point per epoch.
TEST(Report, ThinnedCurvesAreDrawnAtTheirEpochs) {
  json p = Provenance();
  auto& cands = p["rounds"][0]["candidates"];
  cands[0]["curve"] = {{"epoch", {1, 150, 300}}, {"loss", {2.0, 1.0, 0.5}}};
  cands[1]["curve"] = {{"epoch", {1, 3, 2}}, {"loss", {2.0, 1.0, 0.5}}};  // not ascending: by position
  const std::string html = RenderReport({p, json(), "finished"});
  const auto thinned = CurveXs(html, "r1-c00"), plain = CurveXs(html, "r1-c01");
  ASSERT_EQ(thinned.size(), 3u);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(thinned[0], plain[0]);                                     // epoch 1
  EXPECT_NEAR((thinned[1] - thinned[0]) / (thinned[2] - thinned[0]), 149.0 / 299, 0.001);
  EXPECT_NEAR((plain[2] - plain[0]) / (thinned[2] - thinned[0]), 2.0 / 299, 0.001);  // epochs 1..3 of 300
  EXPECT_NE(html.find(">300<"), std::string::npos);                    // the axis reaches epoch 300
}

TEST(Report, EscapesWhatItQuotes) {
  const std::string html = RenderReport({Provenance(), json(), "failed: <b>x</b>"});
  EXPECT_NE(html.find("r1-&lt;c2&gt;"), std::string::npos);
  EXPECT_EQ(html.find("r1-<c2>"), std::string::npos);
  EXPECT_NE(html.find("Run run&amp;1"), std::string::npos);
  EXPECT_NE(html.find("failed: &lt;b&gt;x&lt;/b&gt;"), std::string::npos);
}

TEST(Report, AHalvingRunShowsRungZerosDecisions) {
  const json results = {{"halving",
                         {{"rung0",
                           {{"subset_images", 541}, {"train_images", 5400}, {"rank_by", "knn"}, {"eta", 3}, {"seconds", 3.1},
                            {"backbones",
                             {{{"backbone", "mnv2.b13"}, {"knn", 0.795}, {"logme", 0.231}, {"dim", 576}, {"why", "kept at rung 0"}},
                              {{"backbone", "<ocr>"}, {"knn", 0.706}, {"logme", 0.093}, {"dim", 480},
                               {"why", "dropped at rung 0: kNN 0.706 vs 0.795"}}}}}}}}};
  const std::string html = RenderReport({Provenance(), results, ""});
  EXPECT_NE(html.find("Rung 0: backbones ranked before training"), std::string::npos);
  EXPECT_NE(html.find("541 of 5400 training images, ranked by knn; the best 1/3 kept"), std::string::npos);
  EXPECT_NE(html.find("<td>&lt;ocr&gt;</td><td>0.706</td><td>0.0930</td><td>480</td><td>dropped at rung 0: kNN 0.706 vs "
                      "0.795</td>"),
            std::string::npos);
  EXPECT_EQ(RenderReport({Provenance(), json(), ""}).find("Rung 0"), std::string::npos);  // other strategies: none
  // The rounds after it: which backbones were still in the race, on how much of the data.
  json grown = results;
  grown["rounds"] = {{{"round", 1}, {"halving", {{"backbones", {"mnv2.b13", "<ocr>"}}, {"train_fraction", 1.0 / 9}}}},
                     {{"round", 2}, {"halving", {{"backbones", {"mnv2.b13"}}, {"train_fraction", 1.0}}}}};
  const std::string race = RenderReport({Provenance(), grown, ""});
  EXPECT_NE(race.find("<h3>The race, round by round</h3>"), std::string::npos);
  EXPECT_NE(race.find("<tr><td>1</td><td>mnv2.b13, &lt;ocr&gt;</td><td>11.1 %</td></tr><tr><td>2</td><td>mnv2.b13</td>"
                      "<td>all</td></tr>"),
            std::string::npos)
      << race;
  EXPECT_EQ(html.find("The race"), std::string::npos);  // none without rounds
}

TEST(Report, TheBestSoFarNeverFalls) {
  json p = Provenance();
  p["rounds"][1]["candidates"] = json::array({Candidate("r2-c00", 2, 0.5)});  // round 2 worse
  const std::string html = RenderReport({p, json(), ""});
  const std::regex points("class=\"best-so-far\" points=\"([^\"]*)\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(html, m, points));
  std::vector<double> ys;
  const std::string pts = m[1];
  const std::regex pair("[\\d.]+,([\\d.]+)");
  for (auto it = std::sregex_iterator(pts.begin(), pts.end(), pair); it != std::sregex_iterator(); ++it)
    ys.push_back(std::stod((*it)[1]));
  ASSERT_EQ(ys.size(), 4u);
  for (double y : ys) EXPECT_DOUBLE_EQ(y, ys[0]);  // 0.8 in both rounds
}

TEST(Report, RefusesWhatIsNotAProvenance) {
  for (const json& bad : {json::array(), json{{"format", "x"}}, json{{"format", kProvenanceFormat}},
                          json{{"format", kProvenanceFormat}, {"rounds", {{{"round", "one"}}}}, {"champion", {}}}}) {
    try {
      RenderReport({bad, json(), ""});
      ADD_FAILURE() << bad.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << bad.dump();
      EXPECT_NE(std::string(e.what()).find("provenance.json"), std::string::npos) << e.what();
    }
  }
}

TEST(Report, ConfusionFromAResultBody) {
  const json body = {{"classes", 2}, {"confusion", {1, 2, 3, 4}}, {"split", "validation"},
                     {"test", {{"classes", 2}, {"confusion", {5, 0, 1, 6}}}}};
  EXPECT_EQ(ConfusionOf(body),
            (json{{"split", "test"}, {"classes", 2}, {"class_names", {"0", "1"}}, {"matrix", {{5, 0}, {1, 6}}}}));
  // An image folder's names where the result has them (a class past them by its index).
  json named = body;
  named["test"]["class_names"] = {"cat"};
  EXPECT_EQ(ConfusionOf(named)["class_names"], (json{"cat", "1"}));
  json no_test = body;
  no_test.erase("test");
  EXPECT_EQ(ConfusionOf(no_test)["matrix"], (json{{1, 2}, {3, 4}}));
  EXPECT_EQ(ConfusionOf(no_test)["split"], "validation");
  EXPECT_TRUE(ConfusionOf(json{{"classes", 3}, {"confusion", {1, 2}}}).is_null());  // 2 != 3 x 3
  EXPECT_TRUE(ConfusionOf(json::array()).is_null());
}

TEST(Svg, TicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(svg::Ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  const auto t = svg::Ticks(0.613, 0.871, 6);
  ASSERT_GE(t.size(), 3u);
  EXPECT_GE(t.front(), 0.613);
  EXPECT_LE(t.back(), 0.871 + 1e-12);
  EXPECT_NEAR(t[1] - t[0], 0.05, 1e-12);
  EXPECT_EQ(svg::TickLabel(0.65, 0.05), "0.65");
  EXPECT_EQ(svg::TickLabel(15, 5), "15");
  EXPECT_EQ(svg::Ticks(3, 3, 5), (std::vector<double>{3}));
  const svg::Scale s{0, 10, 100, 200};
  EXPECT_DOUBLE_EQ(s(5), 150);
  EXPECT_DOUBLE_EQ((svg::Scale{1, 1, 0, 10})(1), 5);  // a single point: the middle
  EXPECT_EQ(svg::Escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(Journal, TimeStampsToTheMillisecond) {
  const std::string now = JournalTime();
  EXPECT_TRUE(std::regex_match(now, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"))) << now;
  EXPECT_DOUBLE_EQ(ParseJournalTime("1970-01-01T00:01:00.250Z"), 60.25);
  EXPECT_DOUBLE_EQ(ParseJournalTime("2026-11-23T21:33:55Z"), 1795469635.0);
  EXPECT_TRUE(std::isnan(ParseJournalTime("")));
  EXPECT_TRUE(std::isnan(ParseJournalTime("2026-11-23 21:33:55")));
  EXPECT_TRUE(std::isnan(ParseJournalTime("2026-11-23T21:33:55.1+01:00")));
}

TEST(Status, TaskRowsSayWhatBecameOfEachTask) {
  RunSummary s;
  s.tasks = {"r1-load", "r1-prepare", "r1-train", "r1-store"};
  s.reused = {"r1-load"};
  s.tasks_done = {"r1-load", "r1-prepare"};
  s.starts = {{"r1-prepare", 3}, {"r1-train", 1}, {"r1-store", 1}};
  s.retries = {{"r1-prepare", 2}};
  s.seconds = {{"r1-prepare", 2.5}};
  s.module = {{"r1-prepare", "dam"}, {"r1-train", "dam"}};
  s.ranks = {{"r1-train", 2}};
  s.last_started = "r1-store";
  auto rows = TaskRows(StateFrom(s, 4242, "/runs/x"));  // a live coordinator
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].state, "reused");
  EXPECT_EQ(rows[1].state, "done");
  EXPECT_EQ(rows[1].retries, 2);
  EXPECT_EQ(rows[1].starts, 3);
  EXPECT_DOUBLE_EQ(rows[1].seconds, 2.5);
  EXPECT_EQ(rows[2].state, "pending");  // started by a coordinator before a resume
  EXPECT_EQ(rows[2].ranks, 2);
  EXPECT_EQ(rows[3].state, "running");
  const RunStatus running = StateFrom(s, 4242, "/runs/x");
  EXPECT_EQ(running.state, RunState::kRunning);
  EXPECT_EQ(running.line, "running (coordinator pid 4242), task r1-store");
  s.failed = true;
  s.error = "task r1-store failed";
  rows = TaskRows(StateFrom(s, 0, "/runs/x"));
  EXPECT_EQ(rows[3].state, "failed");
  EXPECT_EQ(rows[2].state, "interrupted");
  s.failed = false;
  const RunStatus gone = StateFrom(s, 0, "/runs/x");
  EXPECT_EQ(gone.state, RunState::kInterrupted);
  EXPECT_NE(gone.line.find("during task r1-store; `msaflow resume /runs/x` continues it"), std::string::npos);
}


TEST(ProgressBar, RendersTheRoundsTasksAndTheRunningOne) {
  EXPECT_EQ(ProgressBar::Render(1, 3, 0, 6, "", 0), "round 1/3 [....................] 0/6 tasks");
  EXPECT_EQ(ProgressBar::Render(2, 3, 3, 6, "train on dam", 1.26),
            "round 2/3 [##########..........] 3/6 tasks  train on dam 1.3 s");
  EXPECT_EQ(ProgressBar::Render(3, 3, 6, 6, "", 0), "round 3/3 [####################] 6/6 tasks");
  EXPECT_EQ(ProgressBar::Render(1, 1, 0, 0, "", 0), "round 1/1 [....................] 0/0 tasks");
}

TEST(ProgressBar, OffATerminalLinesPrintAsTheyAre) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = ::open_memstream(&buf, &len);
  {
    ProgressBar bar(f);  // a memory stream is no terminal
    EXPECT_FALSE(bar.enabled());
    bar.Round(1, 2, 2, 0);
    bar.Start("load on cm");
    bar.Print("a line");
    bar.Tick();
    bar.Done();
    bar.Done();
  }
  std::fclose(f);
  EXPECT_EQ(std::string(buf, len), "a line\n");
  std::free(buf);
}

TEST(ProgressBar, OnATerminalTheBarStaysBelowTheLinesAndEndsFull) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = ::open_memstream(&buf, &len);
  ManualClock clock;  // the running task's clock reads this one: exact, whatever the machine's speed
  {
    ProgressBar bar(f, true, &clock);
    bar.Round(1, 1, 2, 1);  // one task done before (a resume)
    bar.Start("store on dam");
    clock.AdvanceSeconds(2.26);
    bar.Print("stored");
    bar.Done();
    bar.Print("after");  // the round is over: no bar drawn again
  }
  std::fclose(f);
  const std::string out(buf, len);
  std::free(buf);
  const std::string erase = "\r\033[K";
  EXPECT_EQ(out, erase + "round 1/1 [##########..........] 1/2 tasks" +                      // Round
                     erase + "round 1/1 [##########..........] 1/2 tasks  store on dam 0.0 s" +  // Start
                     erase + "stored\n" + erase + "round 1/1 [##########..........] 1/2 tasks  store on dam 2.3 s" +
                     erase + "round 1/1 [####################] 2/2 tasks\nafter\n");
}

TEST(ProgressBar, TheRunningTasksClockIsTheClockItIsGiven) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = ::open_memstream(&buf, &len);
  ManualClock clock;
  {
    ProgressBar bar(f, true, &clock);
    bar.Round(2, 3, 6, 0);
    bar.Start("train on dam");
    clock.AdvanceSeconds(61.04);
    bar.Tick();
  }
  std::fclose(f);
  const std::string out(buf, len);
  std::free(buf);
  EXPECT_NE(out.find("round 2/3 [....................] 0/6 tasks  train on dam 61.0 s"), std::string::npos) << out;
}

}  // namespace
}  // namespace msaflow::report
