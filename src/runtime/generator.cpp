#include "runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/stop_strings.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

std::string_view stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::EndOfGeneration: return "end of generation";
    case StopReason::StopString: return "stop string";
    case StopReason::TokenLimit: return "token limit";
    case StopReason::ContextFull: return "context full";
  }
  return "?";
}

namespace {

KvCacheConfig with_dtype(KvCacheConfig config, GgmlType dtype) {
  config.dtype = dtype;
  return config;
}

}  // namespace

Generator::Generator(Model& model, const Tokenizer& tokenizer, int n_ctx, int max_batch, GgmlType cache_type)
    : model_(model),
      tokenizer_(tokenizer),
      n_ctx_(n_ctx),
      max_batch_(std::max(1, max_batch)),
      cache_(model.backend(), with_dtype(model.cache_config(n_ctx), cache_type)),
      seq_(cache_.add_sequence()) {
  KILN_CHECK(n_ctx > 0, "generator: context of {} tokens", n_ctx);
  logits_.resize(size_t(model.hparams().n_vocab));
}

void Generator::reset() {
  cache_.truncate(seq_, 0);
  cached_.clear();
}

size_t Generator::reuse_prefix(std::span<const int32_t> tokens) {
  KILN_CHECK(!tokens.empty(), "generator: empty prompt");
  KILN_CHECK(tokens.size() <= size_t(n_ctx_),
             "the prompt has {} tokens but the context holds {} (raise it with -c)", tokens.size(), n_ctx_);
  // Keep the longest prefix already cached, but always run at least the last token: its
  // logits are what the caller wants.
  size_t common = 0;
  while (common < cached_.size() && common < tokens.size() && cached_[common] == tokens[common]) ++common;
  common = std::min(common, tokens.size() - 1);
  // Recurrent (linear-attention) state holds every cached token and cannot be rewound:
  // reuse the cache only when the prompt extends it, else start over.
  if (cache_.has_recurrent_state() && common < cached_.size()) common = 0;
  cache_.truncate(seq_, int64_t(common));
  cached_.resize(common);
  last_n_prompt_ = int(tokens.size() - common);
  return common;
}

void Generator::run_chunk(std::span<const int32_t> tokens, size_t begin, size_t end, bool to_argmax) {
  batch_.clear();
  for (size_t i = begin; i < end; ++i) batch_.add(tokens[i], int32_t(i), seq_, i + 1 == tokens.size());
  if (to_argmax) model_.forward_greedy(batch_, cache_, /*feed_back=*/false);
  else model_.forward(batch_, cache_, logits_.data());
  cached_.insert(cached_.end(), tokens.begin() + std::ptrdiff_t(begin), tokens.begin() + std::ptrdiff_t(end));
}

std::span<const float> Generator::prefill(std::span<const int32_t> tokens) {
  for (size_t begin = reuse_prefix(tokens); begin < tokens.size(); begin += size_t(max_batch_))
    run_chunk(tokens, begin, std::min(tokens.size(), begin + size_t(max_batch_)), false);
  return logits_;
}

void Generator::prefill_to_argmax(std::span<const int32_t> tokens) {
  for (size_t begin = reuse_prefix(tokens); begin < tokens.size(); begin += size_t(max_batch_)) {
    const size_t end = std::min(tokens.size(), begin + size_t(max_batch_));
    run_chunk(tokens, begin, end, end == tokens.size());
  }
}

std::span<const float> Generator::decode(int32_t token) {
  KILN_CHECK(cached_.size() < size_t(n_ctx_), "generator: the context of {} tokens is full", n_ctx_);
  batch_.clear();
  batch_.add(token, int32_t(cached_.size()), seq_, true);
  model_.forward(batch_, cache_, logits_.data());
  cached_.push_back(token);
  return logits_;
}

GenerationResult Generator::generate(std::span<const int32_t> prompt, Sampler& sampler,
                                     const GenerationOptions& options, const TextCallback& on_text) {
  GenerationResult result;
  GenerationStats& stats = result.stats;
  StreamingDecoder decoder(tokenizer_);
  // Show the decoder the prompt's last token (output discarded), so that it knows the
  // continuation is not the start of a text: SentencePiece drops a leading space only there.
  if (!prompt.empty()) {
    decoder.push(prompt.back());
    decoder.flush();
  }
  StopStringMatcher stops(options.stop);
  auto show = [&](const std::string& text) {
    if (text.empty()) return;
    result.text += text;
    if (on_text) on_text(text);
  };

  sampler.reset_history();
  const int window = sampler.params().penalty_last_n;
  const size_t first_seen = window < 0 ? 0 : prompt.size() - std::min(prompt.size(), size_t(window));
  for (size_t i = first_seen; i < prompt.size(); ++i) sampler.accept(prompt[i]);

  // Plain greedy decoding keeps the argmax on the device and the host one step ahead: step
  // n + 1 (fed step n's token on the device) is queued before the host reads token n.
  const bool on_device = options.argmax_on_device && sampler.is_plain_argmax();
  auto start = Clock::now();
  std::span<const float> logits;
  if (on_device) prefill_to_argmax(prompt);
  else logits = prefill(prompt);
  stats.prompt_seconds = seconds_since(start);
  stats.n_prompt = last_n_prompt_;
  stats.n_reused = int(prompt.size()) - last_n_prompt_;

  start = Clock::now();
  while (true) {
    if (options.max_tokens >= 0 && stats.n_generated >= options.max_tokens) {
      result.reason = StopReason::TokenLimit;
      break;
    }
    int32_t token;
    const size_t held = cached_.size();  // tokens in the cache before this one
    if (on_device) {
      // Queue the step that decodes this token unless none can follow it.
      const bool another = (options.max_tokens < 0 || stats.n_generated + 1 < options.max_tokens) &&
                           cached_.size() < size_t(n_ctx_);
      if (another) {
        batch_.clear();
        batch_.add(/*token: fed back on the device*/ 0, int32_t(cached_.size()), seq_, true);
        model_.forward_greedy(batch_, cache_, /*feed_back=*/true);
      }
      token = model_.take_greedy().at(0);
      if (another) {
        cached_.push_back(token);  // its step is queued: the cache will hold it
        ++stats.n_decoded;
      }
    } else {
      token = sampler.sample(logits);
    }
    ++stats.n_generated;
    result.tokens.push_back(token);
    if (options.stop_at_end_of_generation && tokenizer_.is_end_of_generation(token)) {
      result.reason = StopReason::EndOfGeneration;
      break;
    }
    show(stops.push(decoder.push(token)));
    if (stops.stopped()) {
      result.reason = StopReason::StopString;
      break;
    }
    if (options.max_tokens >= 0 && stats.n_generated >= options.max_tokens) {
      result.reason = StopReason::TokenLimit;  // no need to run the last token
      break;
    }
    if (held >= size_t(n_ctx_)) {
      result.reason = StopReason::ContextFull;
      break;
    }
    sampler.accept(token);
    if (!on_device) {
      logits = decode(token);
      ++stats.n_decoded;
    }
  }
  while (model_.pending_greedy() > 0) model_.take_greedy();  // a step queued past the stop
  stats.decode_seconds = seconds_since(start);
  if (!stops.stopped()) {
    show(stops.push(decoder.flush()));
    show(stops.flush());
  }
  return result;
}

}  // namespace kiln
