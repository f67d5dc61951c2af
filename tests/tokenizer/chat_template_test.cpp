// ChatTemplate against the templates real models ship (Qwen2's tokenizer_config.json, the
// Llama 3 template in llama.cpp's llama-bpe vocabulary GGUF). Expected prompts are written
// by hand from each template's logic.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "support/testdata.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

Json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

Json pirate_conversation(bool with_system) {
  Json messages = Json::array();
  if (with_system) messages.push_back({{"role", "system"}, {"content", "You are a pirate."}});
  messages.push_back({{"role", "user"}, {"content", "Hi"}});
  messages.push_back({{"role", "assistant"}, {"content", "Arr!"}});
  messages.push_back({{"role", "user"}, {"content", "Where is the gold?"}});
  return messages;
}

std::string error_of(const ChatTemplate& t, const Json& messages) {
  try {
    t.render(messages, true);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, Qwen2WithSystemMessage) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/hf/qwen2/tokenizer_config.json");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(read_json(path));
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_EQ(t.bos_token(), "");  // Qwen2 has none: "bos_token": null
  EXPECT_EQ(t.render(pirate_conversation(true), true),
            "<|im_start|>system\nYou are a pirate.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nArr!<|im_end|>\n"
            "<|im_start|>user\nWhere is the gold?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Qwen2AddsDefaultSystemPrompt) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/hf/qwen2/tokenizer_config.json");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(read_json(path));
  // This template opens the assistant turn after every user turn, so the generation prompt
  // flag changes nothing.
  const std::string expected =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nArr!<|im_end|>\n"
      "<|im_start|>user\nWhere is the gold?<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(t.render(pirate_conversation(false), true), expected);
  EXPECT_EQ(t.render(pirate_conversation(false), false), expected);
}

TEST(ChatTemplate, Llama3FromGgufMetadata) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-llama-bpe.gguf");
  auto file = gguf::File::open(path.string());
  ChatTemplate t(std::string(file->get_string("tokenizer.chat_template")), "<|begin_of_text|>", "<|eot_id|>");
  Json messages = pirate_conversation(true);
  messages[1]["content"] = "  Hi \n";  // the template trims message content
  const std::string turns =
      "<|begin_of_text|>"
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a pirate.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nArr!<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhere is the gold?<|eot_id|>";
  EXPECT_EQ(t.render(messages, true), turns + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.render(messages, false), turns);
}

TEST(ChatTemplate, Qwen2TemplateInGgufMatchesTokenizerConfig) {
  KILN_REQUIRE_TESTDATA(gguf_path, "tokenizer/vocab/ggml-vocab-qwen2.gguf");
  KILN_REQUIRE_TESTDATA(config_path, "tokenizer/hf/qwen2/tokenizer_config.json");
  auto file = gguf::File::open(gguf_path.string());
  EXPECT_EQ(std::string(file->get_string("tokenizer.chat_template")),
            read_json(config_path)["chat_template"].get<std::string>());
}

TEST(ChatTemplate, RaiseExceptionPassesTheTemplateMessage) {
  ChatTemplate t("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok",
                 "", "");
  EXPECT_EQ(error_of(t, Json::parse(R"([{"role": "system", "content": "x"}])")), "System role not supported");
  EXPECT_EQ(t.render(Json::parse(R"([{"role": "user", "content": "x"}])"), true), "ok");
}

TEST(ChatTemplate, StrftimeNowUsesTheClock) {
  ChatTemplate t("Today is {{ strftime_now('%Y-%m-%d') }}.", "", "");
  // 2025-06-28 12:00:00 UTC: the same calendar day in every time zone within +-11 hours.
  auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(1751112000));
  t.set_clock([noon] { return noon; });
  EXPECT_EQ(t.render(Json::array(), false), "Today is 2025-06-28.");
}

TEST(ChatTemplate, VariablesLikeTransformers) {
  ChatTemplate t("{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
                 "{{ enable_thinking is defined }}|{{ messages|length }}",
                 "<s>", "</s>");
  EXPECT_EQ(t.render(Json::array(), true), "<s>|</s>|True|True|True|False|0");
  Json extra = {{"tools", Json::array({{{"name", "f"}}})}, {"enable_thinking", false}};
  EXPECT_EQ(t.render(Json::array(), false, extra), "<s>|</s>|False|True|False|True|0");
}

TEST(ChatTemplate, MessageFieldsAndKeyOrderReachTheTemplate) {
  ChatTemplate t("{% for m in messages %}{{ m.tool_calls[0].function.arguments|tojson }}{% endfor %}", "", "");
  Json messages = Json::parse(
      R"([{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": {"zeta": 1, "alpha": "ü"}}}]}])");
  EXPECT_EQ(t.render(messages, false), R"({"zeta": 1, "alpha": "ü"})");  // insertion order, ensure_ascii=False
}

TEST(ChatTemplate, NamedTemplatesAndTokenObjectsInTokenizerConfig) {
  Json config = Json::parse(R"({
    "bos_token": {"content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ bos_token }}default"}]
  })");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(config);
  EXPECT_EQ(t.render(Json::array(), false), "<s>default");
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(Json::parse(R"({"eos_token": "x"})")), Error);
}

TEST(ChatTemplate, SyntaxErrorsAreReportedAtConstruction) {
  try {
    ChatTemplate t("{% for m in messages %}\n{{ m.content }\n{% endfor %}", "", "");
    FAIL() << "expected a syntax error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, RejectsMessagesThatAreNotAnArray) {
  ChatTemplate t("x", "", "");
  EXPECT_THROW(t.render(Json::object(), false), Error);
}

}  // namespace
}  // namespace kiln
