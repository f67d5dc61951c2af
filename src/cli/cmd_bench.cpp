// `kiln bench -m MODEL`: prompt processing and generation speed, measured the way
// llama-bench measures them, and printed in its layouts, so the figures compare directly:
//   ppP: one forward pass over P random tokens, from an empty cache;
//   tgN: N single-token forward passes, from an empty cache. By default each step decodes
//        the previous step's argmax, taken and fed back on the device (greedy decoding as
//        `kiln run --temp 0` does it), and the host queues the next step before reading the
//        token; --host-tokens feeds random tokens from the host and waits for every step's
//        logits instead, as llama-bench does.
// Each test runs twice to warm up, then `repetitions` times; tokens/s is reported as the
// mean and sample standard deviation over the repetitions.
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/commands.h"
#include "cli/model_session.h"
#include "core/error.h"
#include "runtime/kv_cache.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchCli {
  ModelOptions model;
  std::vector<int> n_prompt{512};  // one pp test per value (0: none)
  std::vector<int> n_gen{128};     // one tg test per value (0: none)
  int repetitions = 3;
  std::string output = "md";
  uint64_t seed = 1234;
  bool host_tokens = false;
};

struct TestResult {
  std::string name;  // "pp512", "tg128"
  int n_prompt = 0, n_gen = 0;
  std::vector<uint64_t> samples_ns;
  std::vector<double> samples_ts;
  std::string test_time;
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

std::vector<double> as_double(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

// llama.cpp's name for a general.file_type (llama_model_ftype_name).
std::string file_type_name(int64_t ftype) {
  switch (ftype) {
    case 0: return "all F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K - Medium";
    case 11: return "Q3_K - Small";
    case 12: return "Q3_K - Medium";
    case 13: return "Q3_K - Large";
    case 14: return "Q4_K - Small";
    case 15: return "Q4_K - Medium";
    case 16: return "Q5_K - Small";
    case 17: return "Q5_K - Medium";
    case 18: return "Q6_K";
    case 25: return "IQ4_NL - 4.5 bpw";
    case 30: return "IQ4_XS - 4.25 bpw";
    case 32: return "BF16";
    case 38: return "MXFP4 MoE";
    default: return fmt::format("ftype {}", ftype);
  }
}

std::string size_label(uint64_t n_params) {
  if (n_params >= 1000000000) {
    const double b = double(n_params) / 1e9;
    return b >= 10 ? fmt::format("{:.0f}B", b) : fmt::format("{:.1f}B", b);
  }
  if (n_params >= 1000000) return fmt::format("{:.0f}M", double(n_params) / 1e6);
  return fmt::format("{:.0f}K", double(n_params) / 1e3);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string name = line.substr(line.find(':') + 1);
      return name.substr(name.find_first_not_of(' '));
    }
  return "unknown";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Random token ids (llama-bench feeds random tokens too: the values do not change the cost).
std::vector<int32_t> random_tokens(int n, int n_vocab, uint64_t& state) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((state >> 33) % uint64_t(n_vocab));
  }
  return ids;
}

KvCacheConfig bench_cache_config(const Model& model, int n_ctx, GgmlType cache_type) {
  KvCacheConfig c = model.cache_config(n_ctx);
  c.dtype = cache_type;
  return c;
}

class Bench {
 public:
  Bench(Model& model, int n_ctx, GgmlType cache_type, uint64_t seed)
      : model_(model), cache_(model.backend(), bench_cache_config(model, n_ctx, cache_type)),
        seq_(cache_.add_sequence()),
        rng_(seed), logits_(size_t(model.hparams().n_vocab)) {}

  // Nanoseconds for one pass over n tokens, from an empty cache.
  uint64_t prompt(int n) {
    const std::vector<int32_t> ids = random_tokens(n, model_.hparams().n_vocab, rng_);
    cache_.truncate(seq_, 0);
    Batch batch;
    for (int i = 0; i < n; ++i) batch.add(ids[size_t(i)], i, seq_, i + 1 == n);
    const auto start = Clock::now();
    model_.forward(batch, cache_, logits_.data());
    return elapsed_ns(start);
  }

  // Nanoseconds for n greedy single-token passes, from an empty cache, the tokens fed back
  // on the device; one step is queued ahead of the one whose token the host reads.
  uint64_t generate_greedy(int n) {
    const std::vector<int32_t> first = random_tokens(1, model_.hparams().n_vocab, rng_);
    cache_.truncate(seq_, 0);
    Batch batch;
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      batch.clear();
      batch.add(i == 0 ? first[0] : 0, i, seq_, true);
      model_.forward_greedy(batch, cache_, /*feed_back=*/i > 0);
      if (model_.pending_greedy() > 1) model_.take_greedy();
    }
    while (model_.pending_greedy() > 0) model_.take_greedy();
    return elapsed_ns(start);
  }

  // Nanoseconds for n single-token passes, from an empty cache.
  uint64_t generate(int n) {
    const std::vector<int32_t> ids = random_tokens(n, model_.hparams().n_vocab, rng_);
    cache_.truncate(seq_, 0);
    Batch batch;
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      batch.clear();
      batch.add(ids[size_t(i)], i, seq_, true);
      model_.forward(batch, cache_, logits_.data());
    }
    return elapsed_ns(start);
  }

 private:
  static uint64_t elapsed_ns(Clock::time_point start) {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  }
  Model& model_;
  KvCache cache_;
  int seq_;
  uint64_t rng_;
  std::vector<float> logits_;
};

TestResult run_test(Bench& bench, int n_prompt, int n_gen, int repetitions, bool host_tokens) {
  TestResult r;
  r.n_prompt = n_prompt;
  r.n_gen = n_gen;
  r.name = n_prompt > 0 ? fmt::format("pp{}", n_prompt) : fmt::format("tg{}", n_gen);
  r.test_time = utc_now();
  const int tokens = n_prompt > 0 ? n_prompt : n_gen;
  auto once = [&] {
    if (n_prompt > 0) return bench.prompt(n_prompt);
    return host_tokens ? bench.generate(n_gen) : bench.generate_greedy(n_gen);
  };
  // Warm-up: first-touch of weights and scratch, thread start-up, graph captures. Twice: the
  // CUDA backend captures a step's graph once for each of its two step slots, and a run's
  // first step may take the other slot in the next run.
  once();
  once();
  for (int i = 0; i < repetitions; ++i) {
    const uint64_t ns = once();
    r.samples_ns.push_back(ns);
    r.samples_ts.push_back(double(tokens) * 1e9 / double(ns));
  }
  return r;
}

struct ModelFacts {
  std::string filename, type;
  std::string backend = "CPU";  // llama-bench's names: CPU, CUDA
  uint64_t size = 0, n_params = 0;
  int threads = 0;
  std::string cache_type;  // the KV cache's entries: f16 or f32
};

void print_markdown(const ModelFacts& m, const std::vector<TestResult>& results) {
  fmt::print("| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |\n", "model", "size", "params", "backend",
             "threads", "test", "t/s");
  fmt::print("| {:-<30} | {:->9}: | {:->9}: | {:-<10} | {:->6}: | {:->14}: | {:->19}: |\n", "", "", "", "", "", "", "");
  const double gib = double(m.size) / double(1ull << 30);
  const std::string size = gib < 1 ? fmt::format("{:.2f} MiB", double(m.size) / double(1 << 20))
                                   : fmt::format("{:.2f} GiB", gib);
  const double p = double(m.n_params);
  const std::string params = p >= 1e9 ? fmt::format("{:.2f} B", p / 1e9)
                             : p >= 1e6 ? fmt::format("{:.2f} M", p / 1e6)
                                        : fmt::format("{:.2f} K", p / 1e3);
  for (const TestResult& r : results) {
    const std::string ts = fmt::format("{:.2f} ± {:.2f}", mean(r.samples_ts), stddev(r.samples_ts));
    fmt::print("| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |\n", m.type, size, params, m.backend,
               m.threads, r.name, ts);
  }
}

void print_json(const ModelFacts& m, const std::vector<TestResult>& results, bool host_tokens) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  const std::string cpu = cpu_model_name();
  for (const TestResult& r : results) {
    const std::vector<double> ns = as_double(r.samples_ns);
    nlohmann::ordered_json j;
    j["cpu_info"] = cpu;
    j["backends"] = m.backend;
    j["model_filename"] = m.filename;
    j["model_type"] = m.type;
    j["model_size"] = m.size;
    j["model_n_params"] = m.n_params;
    j["n_threads"] = m.threads;
    j["type_k"] = m.cache_type;
    j["type_v"] = m.cache_type;
    j["n_prompt"] = r.n_prompt;
    j["n_gen"] = r.n_gen;
    j["test_time"] = r.test_time;
    j["avg_ns"] = uint64_t(mean(ns));
    j["stddev_ns"] = uint64_t(stddev(ns));
    j["avg_ts"] = mean(r.samples_ts);
    j["stddev_ts"] = stddev(r.samples_ts);
    j["samples_ns"] = r.samples_ns;
    j["samples_ts"] = r.samples_ts;
    if (r.n_gen > 0) j["tg_tokens"] = host_tokens ? "host" : "device";
    out.push_back(j);
  }
  fmt::print("{}\n", out.dump(2));
}

void run(const BenchCli& cli) {
  KILN_CHECK(cli.output == "md" || cli.output == "json", "output format '{}': use md or json", cli.output);
  int max_prompt = 0, max_gen = 0;
  for (int n : cli.n_prompt) {
    KILN_CHECK(n >= 0, "-p {}: token counts cannot be negative", n);
    max_prompt = std::max(max_prompt, n);
  }
  for (int n : cli.n_gen) {
    KILN_CHECK(n >= 0, "-n {}: token counts cannot be negative", n);
    max_gen = std::max(max_gen, n);
  }
  KILN_CHECK(max_prompt + max_gen > 0, "nothing to measure (-p and -n are all 0)");
  KILN_CHECK(cli.repetitions > 0, "repetitions {} (-r)", cli.repetitions);
  ModelOptions mo = cli.model;
  mo.n_ctx = std::max(max_prompt, max_gen);
  mo.max_batch = std::max(max_prompt, 1);
  LoadedModel m = load_model(mo, /*with_tokenizer=*/false);

  ModelFacts facts;
  facts.filename = cli.model.path;
  facts.cache_type = type_name(m.cache_type);
  if (auto* cpu = dynamic_cast<CpuBackend*>(m.backend.get())) facts.threads = cpu->pool().size();
  if (m.backend->device() == Device::Cuda) facts.backend = "CUDA";
  if (m.file) {
    for (const gguf::TensorInfo& t : m.file->tensors()) {
      facts.size += t.bytes;
      facts.n_params += uint64_t(t.elements());
    }
  }
  facts.type = fmt::format("{} {} {}", m.model->hparams().arch, size_label(facts.n_params),
                           m.file ? file_type_name(m.file->get_int("general.file_type", 0)) : "checkpoint");

  Bench bench(*m.model, m.n_ctx, m.cache_type, cli.seed);
  std::vector<TestResult> results;
  // llama-bench's order: every prompt test, then every generation test.
  for (int n : cli.n_prompt)
    if (n > 0) results.push_back(run_test(bench, n, 0, cli.repetitions, cli.host_tokens));
  for (int n : cli.n_gen)
    if (n > 0) results.push_back(run_test(bench, 0, n, cli.repetitions, cli.host_tokens));
  if (cli.output == "md") print_markdown(facts, results);
  else print_json(facts, results, cli.host_tokens);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto cli = std::make_shared<BenchCli>();
  auto* cmd = app.add_subcommand("bench", "Measure prompt (pp) and generation (tg) speed, llama-bench style");
  add_model_options(cmd, cli->model, /*with_context=*/false);
  cmd->add_option("-p,--n-prompt", cli->n_prompt, "Prompt tokens in one pass; a comma list runs one test each (0: skip)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", cli->n_gen, "Tokens generated one at a time; a comma list runs one test each (0: skip)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", cli->repetitions, "Measured runs of each test (after two unmeasured warm-up runs)")
      ->capture_default_str();
  cmd->add_option("-o,--output", cli->output, "md (llama-bench's table) or json (its records)")->capture_default_str();
  cmd->add_option("--seed", cli->seed, "Seed of the random prompt tokens")->capture_default_str();
  cmd->add_flag("--host-tokens", cli->host_tokens,
                "tg: feed random tokens from the host and wait for each step's logits (llama-bench's way); "
                "default: greedy, each step's argmax fed back on the device without waiting");
  cmd->callback([cli] { run(*cli); });
}

}  // namespace kiln::cli
