#include "tokenizer/chat_template.h"

#include <ctime>

#include "core/error.h"
#include "tokenizer/jinja_eval.h"
#include "tokenizer/jinja_template.h"

namespace kiln {

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {
  jinja::TemplateOptions options;
  options.trim_blocks = true;  // what transformers' apply_chat_template uses
  options.lstrip_blocks = true;
  template_ = std::make_unique<jinja::Template>(source_, options);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

// A special token in tokenizer_config.json is a string or {"content": "...", ...}.
static std::string special_token_text(const nlohmann::ordered_json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("tokenizer config: '{}' is neither a string nor a token object", key);
}

ChatTemplate ChatTemplate::from_tokenizer_config(const nlohmann::ordered_json& config) {
  auto it = config.find("chat_template");
  if (it == config.end()) fail("tokenizer config has no 'chat_template'");
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& named : *it)
      if (named.value("name", "") == "default") source = named.value("template", "");
    if (source.empty()) fail("tokenizer config: 'chat_template' list has no template named 'default'");
  } else {
    fail("tokenizer config: 'chat_template' is neither a string nor a list");
  }
  return ChatTemplate(std::move(source), special_token_text(config, "bos_token"),
                      special_token_text(config, "eos_token"));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) fail("chat template: messages must be a JSON array, got {}", messages.type_name());
  if (!extra.is_null() && !extra.is_object())
    fail("chat template: extra variables must be a JSON object, got {}", extra.type_name());
  std::unordered_map<std::string, jinja::Value> vars;
  vars["messages"] = jinja::Value::from_json(messages);
  vars["add_generation_prompt"] = jinja::Value(add_generation_prompt);
  vars["bos_token"] = jinja::Value(bos_token_);
  vars["eos_token"] = jinja::Value(eos_token_);
  vars["tools"] = jinja::Value(nullptr);
  vars["documents"] = jinja::Value(nullptr);
  vars["raise_exception"] = jinja::Value::function("raise_exception", [](const jinja::CallArgs& args) -> jinja::Value {
    throw jinja::TemplateError(args.positional.empty() ? "raise_exception() called" : args.positional[0].str());
  });
  auto clock = clock_;
  vars["strftime_now"] = jinja::Value::function("strftime_now", [clock](const jinja::CallArgs& args) {
    if (args.positional.empty() || !args.positional[0].is_string()) fail("strftime_now needs a format string");
    std::time_t now = std::chrono::system_clock::to_time_t(clock ? clock() : std::chrono::system_clock::now());
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, args.positional[0].as_string().c_str(), &local);
    return jinja::Value(std::string(buf, n));
  });
  if (extra.is_object())
    for (const auto& [key, value] : extra.items()) vars[key] = jinja::Value::from_json(value);
  return template_->render(vars);
}

}  // namespace kiln
