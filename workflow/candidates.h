// Candidates: backbone x head hyper-parameters x seed. Round 1 samples the search space;
// later rounds derive new candidates from the best so far (strategy), keeping the top-k.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/head.h"
#include "workflow/pipeline.h"

namespace msaflow::workflow {

struct Candidate {
  std::string id;        // "r<round>-c<index>", unique within a run
  std::string backbone;
  kernels::HeadConfig head;
  std::string warm_start;  // NAM model object to start from, or ""
  std::string parent;      // candidate it was derived from, or ""
  // Fine-tuning (docs/finetune.md): the backbone's layers from its train_from on train with the
  // head, at the head's learning rate times backbone_lr_scale.
  bool finetune = false;
  double backbone_lr_scale = 0;
};

nlohmann::json ToJson(const Candidate& c);
Candidate CandidateFromJson(const nlohmann::json& j);
std::string HeadLabel(const kernels::HeadConfig& h);  // "mlp-128 adam lr=1e-3 l2=1e-4 e=20"

// Round r's candidates on a backbone with "train_from" fine-tune from rounds.finetune_from_round
// on (Pipeline::FinetunesIn), with a backbone_lr_scale of the head space (a child keeps its
// fine-tuned parent's); in the first round that fine-tunes after rounds of frozen heads, every
// candidate starts from its parent's trained head (warm start).
// Round 1: `rounds.candidates` configurations sampled without replacement from the search
// space, backbones taken in turn so every backbone is tried (halving: for HalvingRoundEpochs(p, 1,
// the models among them) epochs each). Deterministic for rounds.seed.
std::vector<Candidate> FirstRound(const Pipeline& p);

struct Ranked {
  Candidate candidate;
  double metric = 0;
  std::string model;  // its NAM model object
  nlohmann::json test;  // its test-split metrics {accuracy, loss, per_class}, when selection used validation
  nlohmann::json classes;  // {per_class (on the selection split), class_names (image folders)}, as select wrote them
};

// Round r >= 2 from the ranking so far (best first). The parents are the top-k and, so that one
// unlucky draw does not end a backbone, the best candidate of every other backbone whose metric
// is within rounds.backbone_margin of the champion's (`backbone_best`: each backbone's best
// so far, from any round); new candidates are dealt over the parents in turn. perturb: children
// with learning rate and L2 scaled by 0.5/2 and 0.3/3, new seeds, the champion's first child
// warm-started from its weights; restart: the parents' configurations with new seeds; random:
// fresh samples. Deterministic for rounds.seed and the rankings.
// halving: the best ceil(n / eta) of the previous round's n candidates, each continued from its
// weights (warm start, same configuration) for HalvingRoundEpochs(round, their models) epochs of that round's data.
std::vector<Candidate> NextRound(const Pipeline& p, int round, const std::vector<Ranked>& ranking,
                                 const std::vector<Ranked>& backbone_best = {});

// The ONNX models the candidates' backbones run (cuts of one model share a pass over the images;
// raw pixels cost nothing to prepare): what a smaller race could spare preparing.
size_t ModelsOf(const Pipeline& p, const std::vector<Candidate>& cands);
// The ONNX models of all the pipeline's backbones.
size_t ModelsOf(const Pipeline& p);

// halving: the epochs a candidate has trained in all by the end of round r: the pipeline's
// largest "epochs" in the last round (rounds.max), 1/eta of it a round before, ... (at least r).
int64_t HalvingEpochs(const Pipeline& p, int round);

// halving with rounds.grow_data: the part of the training split round r trains on when the
// backbones still in the race run `models` ONNX models: 1/eta a round before the last
// (rounds.max, which has all of it), 1/eta^2 before that, ..., but at least rounds.rank_fraction
// (rung 0 computed those features already). All of it (1) when they run fewer than two models:
// cuts of one model share its pass over the images and raw pixels cost nothing, so no smaller
// part would spare anything; for every other strategy; and where a backbone is int8 (its ranges
// are measured on the training images, so a subset would give it other features).
double HalvingDataFraction(const Pipeline& p, int round, size_t models);

// A round's share of the training data as the journal's readers print it: "all" or "11.1 %".
std::string DataShareText(double fraction);

// halving: the epochs a candidate trains in round r over that round's data: as many steps as the
// epochs of the whole split HalvingEpochs adds in round r (on a third of the data, three times
// the epochs), so a subset makes preparing cheaper but no head less trained (at least 1).
int64_t HalvingRoundEpochs(const Pipeline& p, int round, size_t models);

// What round r's tasks run: `p` itself, but for halving only the backbones of the round's
// candidates (`fresh`: those still in the race) and the training split's subset of
// HalvingDataFraction(p, r, their models) (SplitSpec::subset, rounds.seed).
Pipeline RoundPipeline(const Pipeline& p, int round, const std::vector<Candidate>& fresh);

}  // namespace msaflow::workflow
