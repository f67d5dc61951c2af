#pragma once
// Choosing the next token from a row of logits.
//
// The chain runs in llama.cpp's default order (common/sampling, `--samplers` default):
//
//   1. penalties   over the last `penalty_last_n` tokens seen (prompt and output):
//                  repetition (logit / r when positive, * r when negative), then
//                  frequency (- count * f) and presence (- p when the token occurs at all);
//   2. top-k       keep the k largest logits (k <= 0: off);
//   3. top-p       softmax of the survivors; keep the smallest prefix (by probability) whose
//                  mass reaches p, the token that crosses p included (p >= 1: off);
//   4. min-p       keep tokens with probability >= min_p * (largest probability) (0: off);
//   5. temperature divide the logits by T;
//   6. sample      softmax and one draw from the seeded generator.
//
// Temperature comes last, so top-p and min-p judge the distribution at temperature 1, as
// llama.cpp's does. A temperature <= 0 means greedy: the arg max of the penalized logits.
// The same seed and the same inputs always give the same tokens (the generator and the
// uniform draw are kiln's own, not the standard library's implementation-defined ones).
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

namespace kiln {

struct SamplerParams {
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;    // 1: off
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int penalty_last_n = 64;        // window of recent tokens the penalties count (0: off, -1: all)
  uint64_t seed = 0;
};

// A token still in the running, with its (adjusted) logit and, after a softmax, probability.
struct Candidate {
  int32_t id;
  float logit;
  float p;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);

  const SamplerParams& params() const { return params_; }
  // Whether sample() is the plain argmax of the logits (greedy, no penalties): then the
  // choice can be made where the logits are, on the device.
  bool is_plain_argmax() const {
    return params_.temperature <= 0 && params_.repeat_penalty == 1.0f && params_.frequency_penalty == 0.0f &&
           params_.presence_penalty == 0.0f;
  }

  // Picks a token from `logits` (one per vocabulary entry). Does not record it: call
  // accept() with the token that is actually fed to the model.
  int32_t sample(std::span<const float> logits);
  // Records a token (of the prompt or the output) for the penalties.
  void accept(int32_t token);
  // Forgets the recorded tokens (a new conversation); the random stream continues.
  void reset_history();

  // The steps, exposed for tests. Each works on `candidates` in place.
  void apply_penalties(std::vector<Candidate>& candidates) const;
  static void apply_top_k(std::vector<Candidate>& candidates, int k);
  static void apply_top_p(std::vector<Candidate>& candidates, float p);
  static void apply_min_p(std::vector<Candidate>& candidates, float min_p);
  static void apply_temperature(std::vector<Candidate>& candidates, float temperature);
  // Sorts by logit (largest first) and fills p with the softmax of the logits.
  static void softmax(std::vector<Candidate>& candidates);

  // The next uniform number in [0, 1) of the seeded stream.
  double next_uniform();

 private:
  SamplerParams params_;
  uint64_t rng_state_[4];
  std::deque<int32_t> recent_;                  // the penalty window, oldest first
  std::unordered_map<int32_t, int> counts_;     // occurrences of each token in the window
  std::vector<Candidate> candidates_;           // reused between calls
};

// Index of the largest element (the first one on ties).
int32_t argmax(std::span<const float> logits);

}  // namespace kiln
