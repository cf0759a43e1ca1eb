// The round loop's logic, without processes or files: which candidates a round trains, what a
// finished round's NAM objects say (ranking, kept models, best per backbone), the stop rule, and
// the run's results (record/run_dir.h). A resumed run replays its finished rounds through the same code, so it
// reaches the same candidates and the same champion as a run that was never interrupted.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nam/store.h"
#include "orchestrator/planner.h"

namespace msaflow::orchestrator {

inline constexpr char kResultsFormat[] = "msaflow.results/1";

// What a finished round left in the NAM: the select step's best object, what prepare did, the
// train step's and the evaluate farm's figures (without the farm's task lists).
struct RoundOutcome {
  nlohmann::json best, prepared, training, evaluation;
};
RoundOutcome ReadRoundOutcome(nam::Store& store, const std::string& run, int round);

// A round's entry in the run's results: champion, top-k, every candidate, features, training,
// evaluation, each step's seconds, the selection device, and each step's cost per item.
nlohmann::json RoundEntry(const Pipeline& p, int round, const RoundOutcome& o, nlohmann::json step_seconds);

class RoundLoop {
 public:
  explicit RoundLoop(const Pipeline& p) : p_(p) {}

  // Round r's new candidates (round 1: the first round's; later: from the ranking so far).
  std::vector<Candidate> Candidates(int round) const;
  // The models kept from earlier rounds that the select step of the round training `fresh` ranks
  // again: the last select's top-k. halving: the top-k of those on a backbone still in the race
  // (`fresh`'s): a backbone that leaves the race takes its heads with it, as in successive halving.
  std::vector<KeptCandidate> KeptFor(const std::vector<Candidate>& fresh) const;
  // Whether round `round`, training `fresh`, runs the test split. Every round does, except a
  // halving round whose race runs two models or more and that cannot be the run's last
  // (docs/search.md): not the last of rounds.max, and the stop rule cannot end the run after it (patience not reached
  // with this round, or, with min_delta 0, a model as good as the best so far is among those its select ranks again).
  // So no test image goes through a backbone that leaves the race, and the last round scores on test the heads it
  // trains and the models it keeps (select, for a kept model its round held back).
  bool TestsInRound(int round, const std::vector<Candidate>& fresh) const;

  // Takes a finished round in (its best object, and the round's entry for the results);
  // returns true when the stop rule ends the run after it.
  bool Absorb(int round, const RoundOutcome& o, nlohmann::json round_entry);

  const std::string& stop_reason() const { return stop_reason_; }
  int rounds() const { return static_cast<int>(rounds_.size()); }
  // The champion: the best over all rounds. Throws kInternal before any round.
  const Ranked& champion() const;
  // the run's results (docs/formats.md): the rounds, the champion, its test result, best per backbone.
  nlohmann::json Results(const std::string& run, const std::string& nam_uri, double seconds) const;
  // Each backbone's best candidate: {backbone: {candidate, <select_on>_accuracy, test_accuracy}}.
  const nlohmann::json& best_per_backbone() const { return per_bb_test_; }
  // Whether the champion's result is a held-out test figure (false: selected on test).
  bool held_out() const;

 private:
  const Pipeline& p_;
  std::vector<Ranked> ranking_;      // best first, over all rounds
  std::vector<KeptCandidate> kept_;  // the last select's top-k
  // Everything the last select ranked, best first, with its accuracy on the selection split.
  std::vector<std::pair<KeptCandidate, double>> ranked_;
  // halving: the top-k of ranked_ on the backbones of `fresh` (the race), best first.
  std::vector<std::pair<KeptCandidate, double>> HalvingKept(const std::vector<Candidate>& fresh) const;
  std::map<std::string, Ranked> bb_best_;          // backbone -> its best candidate so far
  nlohmann::json per_bb_ = nlohmann::json::object();       // backbone -> best accuracy on the selection split
  nlohmann::json per_bb_test_ = nlohmann::json::object();  // ... that candidate, with its test accuracy
  nlohmann::json rounds_ = nlohmann::json::array();
  double best_so_far_ = -1;
  int stale_ = 0;
  std::string stop_reason_ = "max rounds reached";
};

}  // namespace msaflow::orchestrator
