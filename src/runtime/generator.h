#pragma once
// The generation loop for one sequence: prefill the prompt (in chunks of at most
// `max_batch` tokens, one forward pass each), then one token per step until an
// end-of-generation token, a stop string, the token limit or a full context.
//
// The generator remembers which tokens its KV cache holds. A new prompt that starts with
// them (the next turn of a chat, re-rendered whole) only prefills what is new; where the
// prompt departs from the cache, the cache is cut back to the common prefix.
//
//   Generator gen(*model, tokenizer, /*n_ctx=*/4096);
//   Sampler sampler(params);
//   auto r = gen.generate(tokenizer.encode("Once upon a time"), sampler, {.max_tokens = 100},
//                         [](std::string_view text) { fwrite(text.data(), 1, text.size(), stdout); });
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct GenerationOptions {
  int max_tokens = -1;             // < 0: until the context is full
  std::vector<std::string> stop;   // stop strings (never shown)
  bool stop_at_end_of_generation = true;
  // Plain greedy sampling takes the argmax where the logits are (the device) and queues
  // each step before the host reads the previous token; false samples on the host.
  bool argmax_on_device = true;
};

enum class StopReason { EndOfGeneration, StopString, TokenLimit, ContextFull };
std::string_view stop_reason_name(StopReason reason);

struct GenerationStats {
  int n_prompt = 0;          // prompt tokens run through the model by this call
  int n_reused = 0;          // prompt tokens found already in the cache
  double prompt_seconds = 0;
  int n_generated = 0;       // tokens sampled
  int n_decoded = 0;         // single-token forward passes
  double decode_seconds = 0; // those passes and their sampling
  double prompt_tokens_per_second() const { return prompt_seconds > 0 ? n_prompt / prompt_seconds : 0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? n_decoded / decode_seconds : 0; }
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // sampled, including a final end-of-generation token
  std::string text;             // what was shown (stop strings and after removed)
  StopReason reason = StopReason::TokenLimit;
  GenerationStats stats;
};

// Receives shown text: whole UTF-8 characters, in order.
using TextCallback = std::function<void(std::string_view text)>;

class Generator {
 public:
  // `model` and `tokenizer` must outlive the generator. Allocates the KV cache for one
  // sequence of `n_ctx` tokens, its entries of `cache_type` (F32 or F16, see KvCacheConfig).
  Generator(Model& model, const Tokenizer& tokenizer, int n_ctx, int max_batch = 512,
            GgmlType cache_type = GgmlType::F32);

  int n_ctx() const { return n_ctx_; }
  // The tokens the cache holds, in order.
  const std::vector<int32_t>& cached_tokens() const { return cached_; }
  // Empties the cache.
  void reset();

  // Makes the cache hold exactly `tokens` and returns the logits after the last one
  // (valid until the next call). Throws when `tokens` is empty or longer than the context.
  std::span<const float> prefill(std::span<const int32_t> tokens);
  // The same, but the last chunk leaves its argmax on the device (Model::forward_greedy)
  // instead of returning logits; the token is read with model.take_greedy().
  void prefill_to_argmax(std::span<const int32_t> tokens);
  // Appends one token and returns the logits after it.
  std::span<const float> decode(int32_t token);

  // Prefills `prompt` and samples until a stop condition. The sampler's penalty history
  // is reset to the prompt's tokens first.
  GenerationResult generate(std::span<const int32_t> prompt, Sampler& sampler, const GenerationOptions& options,
                            const TextCallback& on_text = {});

 private:
  // Cuts the cache back to the longest reusable prefix of `tokens`; returns its length.
  size_t reuse_prefix(std::span<const int32_t> tokens);
  // Runs tokens [begin, end) as one batch; the last token wants logits when `last`.
  void run_chunk(std::span<const int32_t> tokens, size_t begin, size_t end, bool to_argmax);

  Model& model_;
  const Tokenizer& tokenizer_;
  int n_ctx_;
  int max_batch_;
  KvCache cache_;
  int seq_;
  std::vector<int32_t> cached_;
  Batch batch_;
  std::vector<float> logits_;
  int last_n_prompt_ = 0;  // tokens prefill() ran through the model in its last call
};

}  // namespace kiln
