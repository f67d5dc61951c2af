// `kiln template` renders a model's chat template (GGUF metadata, tokenizer_config.json,
// chat_template.jinja) to hand-derived prompts; `kiln tokenize` reads tokenizer.json.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/run_kiln.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

fs::path scratch_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kiln-template-test-" + std::to_string(::getpid()) + "-" + name);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

constexpr const char* kConversation = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi"},
  {"role": "assistant", "content": "Hello!"},
  {"role": "user", "content": "2+2?"}
])";

TEST(CliTemplate, Qwen2GgufTemplate) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "tokenizer/vocab/ggml-vocab-qwen2.gguf");
  const fs::path dir = scratch_dir("qwen2");
  write(dir / "messages.json", kConversation);
  const CommandResult r = run_kiln("template -m " + shell_quote(model.string()) + " --messages " +
                                   shell_quote((dir / "messages.json").string()) + " --add-generation-prompt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // This Qwen2 template takes the system message, and opens the assistant turn after
  // every user message by itself.
  EXPECT_EQ(r.output,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello!<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");

  // Without a system message it supplies its own.
  write(dir / "one.json", R"({"messages": [{"role": "user", "content": "Hi"}]})");
  const CommandResult one = run_kiln("template -m " + shell_quote(model.string()) + " --messages " +
                                     shell_quote((dir / "one.json").string()));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.output,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  fs::remove_all(dir);
}

TEST(CliTemplate, Qwen2TokenizerConfigInADirectory) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(config, "tokenizer/hf/qwen2/tokenizer_config.json");
  const fs::path dir = scratch_dir("qwen2-dir");
  fs::copy_file(config, dir / "tokenizer_config.json");
  write(dir / "messages.json", kConversation);
  const CommandResult r = run_kiln("template -m " + shell_quote(dir.string()) + " --messages " +
                                   shell_quote((dir / "messages.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello!<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  fs::remove_all(dir);
}

TEST(CliTemplate, ChatTemplateJinjaWithToolsAndSpecialTokens) {
  KILN_REQUIRE_BINARY();
  const fs::path dir = scratch_dir("jinja");
  // The separate file wins over the config's template; bos/eos come from the config.
  write(dir / "tokenizer_config.json",
        R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}, "chat_template": "unused"})");
  write(dir / "chat_template.jinja",
        "{{ bos_token }}{% if tools %}[tools: {{ tools | map(attribute='name') | join(', ') }}]\n{% endif %}"
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}");
  write(dir / "messages.json",
        R"({"messages": [{"role": "user", "content": "Weather?"}], "tools": [{"name": "get_weather"}, {"name": "search"}]})");
  const std::string args = "template -m " + shell_quote(dir.string()) + " --messages " + shell_quote((dir / "messages.json").string());
  const CommandResult with_prompt = run_kiln(args + " --add-generation-prompt");
  ASSERT_EQ(with_prompt.exit_code, 0) << with_prompt.output;
  EXPECT_EQ(with_prompt.output, "<s>[tools: get_weather, search]\n[user] Weather?</s>\n[assistant] ");
  const CommandResult without = run_kiln(args);
  EXPECT_EQ(without.output, "<s>[tools: get_weather, search]\n[user] Weather?</s>\n");

  // Errors name the problem.
  write(dir / "bad.json", R"({"msgs": []})");
  const CommandResult bad = run_kiln("template -m " + shell_quote(dir.string()) + " --messages " + shell_quote((dir / "bad.json").string()));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("\"messages\""), std::string::npos) << bad.output;
  fs::remove(dir / "chat_template.jinja");
  write(dir / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  const CommandResult none = run_kiln(args);
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_NE(none.output.find("chat_template"), std::string::npos) << none.output;
  fs::remove_all(dir);
}

TEST(CliTokenize, ReadsTokenizerJsonDirectory) {
  KILN_REQUIRE_BINARY();
  const fs::path dir = scratch_dir("tokenize");
  // A tiny unigram model: Viterbi picks "ab"+"c" (-3.5) over "a"+"bc" (-4).
  write(dir / "tokenizer.json",
        R"({"model": {"type": "Unigram", "unk_id": 0, "byte_fallback": false,
            "vocab": [["<unk>", 0.0], ["a", -3.0], ["b", -3.0], ["c", -1.5], ["ab", -2.0], ["bc", -1.0]]},
            "normalizer": null, "pre_tokenizer": null, "decoder": null})");
  const CommandResult r = run_kiln("tokenize -m " + shell_quote(dir.string()) + " --no-bos abc");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "4 3\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
