// The generation service: tokens to text, stop strings, n choices, and tool calls found in the
// reply (auto) or constrained by a grammar (required, a named function). A scripted model (its
// logits pick the tokens of a given text) stands in for a model trained to call tools; the tiny
// random model serves the rest.
#include "llm/generation_service.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <map>
#include <string>

#include "common/mutex.h"
#include "llm/load_llm.h"

namespace sluice::llm {
namespace {

std::string Dir() { return std::string(SLUICE_TEST_MODELS) + "/tiny_llm"; }

// A Hermes-style template (Qwen2.5's way of writing tools and calls).
constexpr const char* kHermesTemplate =
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for tool in tools %}\n{{ tool | tojson }}"
    "{%- endfor %}\nCall one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for call in message.tool_calls %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", "
    "\"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>{%- endfor %}"
    "<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";

// Gives, after each prompt, the tokens of `script` and then an end-of-sequence token, whatever
// the prompt (the tiny model's shapes; prefix caching off, so a prompt always runs whole).
class ScriptedModel : public StepModel {
 public:
  ScriptedModel(std::unique_ptr<StepModel> shape, std::vector<int32_t> script)
      : shape_(std::move(shape)), script_(std::move(script)) {}
  const ModelArchitecture& architecture() const override { return shape_->architecture(); }
  int slots() const override { return shape_->slots(); }
  int context_length() const override { return shape_->context_length(); }
  Status CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>&) override {
    return Status::Ok();
  }
  int64_t weight_bytes() const override { return 0; }
  Status Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) override {
    const int vocab = architecture().vocab_size;
    for (const SequenceChunk& chunk : chunks) {
      const int end = chunk.start + static_cast<int>(chunk.tokens.size());
      if (chunk.tokens.size() > 1) prompt_end_[chunk.slot] = end;
      const size_t next = static_cast<size_t>(end - prompt_end_[chunk.slot]);
      const int32_t token =
          next < script_.size() ? script_[next] : architecture().eos_token_ids.at(0);
      std::vector<float> row(static_cast<size_t>(vocab), 0.0f);
      row[static_cast<size_t>(token)] = 100.0f;
      logits->insert(logits->end(), row.begin(), row.end());
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<StepModel> shape_;
  std::vector<int32_t> script_;
  std::map<int, int> prompt_end_;
};

LlmLoadOverrides Overrides() {
  LlmLoadOverrides overrides;
  overrides.precision = "fp32";
  overrides.slots = 4;
  overrides.threads = 1;
  overrides.context_length = 512;  // Room for a prompt that lists tools.
  return overrides;
}

// An engine whose replies are `reply`, under `chat_template` (`dir`'s shapes and tokenizer).
std::shared_ptr<LlmEngine> Scripted(const std::string& reply, const std::string& chat_template,
                                    const std::string& dir = Dir()) {
  auto shape = LoadStepModel(dir, Overrides());
  EXPECT_TRUE(shape.ok()) << shape.status().ToString();
  auto tokenizer = Tokenizer::Load(dir);
  EXPECT_TRUE(tokenizer.ok());
  auto parsed = ChatTemplate::Parse(chat_template);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  std::vector<int32_t> script = (*tokenizer)->Encode(reply, /*add_special_tokens=*/false);
  LlmServeConfig config;
  config.prefix_caching = false;
  config.slots = 4;
  config.context_length = 512;
  config.prefill_chunk = 512;  // A prompt in one chunk: a one-token chunk is a decode step.
  return std::make_shared<LlmEngine>(
      std::make_unique<ScriptedModel>(std::move(*shape), std::move(script)), std::move(*tokenizer),
      std::move(*parsed), config);
}

// Everything a generation told its observer; Wait() returns once it is over.
class Recorder : public GenerationObserver {
 public:
  explicit Recorder(int n) : finished_(static_cast<size_t>(n), false) {}
  void OnRejected(const Status& status, std::string_view param, double) override {
    MutexLock lock(mu_);
    rejected = status;
    rejected_param = std::string(param);
    over_ = true;
    cv_.SignalAll();
  }
  void OnAccepted() override {
    MutexLock lock(mu_);
    accepted = true;
  }
  void OnChoice(const ChoiceEvent& event) override {
    MutexLock lock(mu_);
    events.push_back(event);
    if (event.finish != FinishReason::kNone) finished_[event.index] = true;
    over_ = std::all_of(finished_.begin(), finished_.end(), [](bool b) { return b; });
    if (over_) cv_.SignalAll();
  }
  void OnFailed(const Status& error) override {
    MutexLock lock(mu_);
    failed = error;
    over_ = true;
    cv_.SignalAll();
  }
  void Wait() {
    MutexLock lock(mu_);
    while (!over_) cv_.Wait(lock);
  }
  // Choice `index`'s events joined.
  ChoiceEvent Joined(size_t index) {
    MutexLock lock(mu_);
    ChoiceEvent all;
    for (const ChoiceEvent& e : events) {
      if (e.index != index) continue;
      all.content += e.content;
      all.reasoning += e.reasoning;
      all.tool_calls.insert(all.tool_calls.end(), e.tool_calls.begin(), e.tool_calls.end());
      all.completion_tokens = e.completion_tokens;
      all.finish = e.finish;
    }
    return all;
  }

  Status rejected = Status::Ok();
  std::string rejected_param;
  Status failed = Status::Ok();
  bool accepted = false;
  std::vector<ChoiceEvent> events;

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<bool> finished_;
  bool over_ = false;
};

GenerateRequest Chat(const std::string& text) {
  GenerateRequest r;
  r.chat = true;
  ChatMessage message;
  message.role = "user";
  message.content = text;
  r.messages.push_back(std::move(message));
  r.max_tokens = 64;
  r.sampling.temperature = 0;
  return r;
}

ToolOptions WeatherTool(ToolOptions::Choice choice) {
  ToolOptions tools;
  tools.functions.push_back(ToolFunction{
      "get_weather",
      R"({"type":"object","properties":{"unit":{"enum":["c","f"]}},"required":["unit"]})"});
  tools.definitions =
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
      R"("properties":{"unit":{"enum":["c","f"]}},"required":["unit"]}}}])";
  tools.choice = choice;
  return tools;
}

std::shared_ptr<Recorder> Generate(GenerationService& service, GenerateRequest request,
                                   const std::string& model = "m") {
  auto recorder = std::make_shared<Recorder>(request.n);
  std::string name = model;
  auto engine = service.Find(name);
  EXPECT_TRUE(engine.ok());
  service.Start(*engine, std::move(request), recorder);
  recorder->Wait();
  return recorder;
}

// A step's prompt budget left unset in config.yaml is the model's (64 where its products take the
// int8 tiles); one set is kept.
TEST(GenerationServiceTest, TheStepBudgetLeftUnsetIsTheModels) {
  class Budgeted : public ScriptedModel {
   public:
    using ScriptedModel::ScriptedModel;
    int default_step_tokens() const override { return 5; }
  };
  for (int configured : {0, 7}) {
    auto shape = LoadStepModel(Dir(), Overrides());
    ASSERT_TRUE(shape.ok()) << shape.status().ToString();
    EXPECT_EQ((*shape)->default_step_tokens(), StepModel::kStepTokens);  // fp32: no tiles.
    auto tokenizer = Tokenizer::Load(Dir());
    ASSERT_TRUE(tokenizer.ok());
    auto parsed = ChatTemplate::Parse(kHermesTemplate);
    ASSERT_TRUE(parsed.ok());
    LlmServeConfig config;
    config.max_step_tokens = configured;
    LlmEngine engine(std::make_unique<Budgeted>(std::move(*shape), std::vector<int32_t>{}),
                     std::move(*tokenizer), std::move(*parsed), config);
    EXPECT_EQ(engine.config().max_step_tokens, configured == 0 ? 5 : configured);
  }
  EXPECT_EQ(LlmServeConfig{}.max_step_tokens, 0);
}

TEST(GenerationServiceTest, AStopStringEndsTheChoiceBeforeIt) {
  auto engine = LoadLlmEngine(Dir(), Overrides());
  ASSERT_TRUE(engine.ok());
  GenerationService service({{"m", *engine}});
  GenerateRequest request;
  request.prompt = "hello world";
  request.max_tokens = 40;
  request.ignore_eos = true;
  request.sampling.temperature = 0;
  const std::string full = Generate(service, request)->Joined(0).content;
  ASSERT_GE(full.size(), 8u);
  const std::string stop = full.substr(4, 3);
  request.stop = {"no such stop string", stop};
  auto stopped = Generate(service, request);
  const ChoiceEvent choice = stopped->Joined(0);
  EXPECT_EQ(choice.finish, FinishReason::kStop);
  EXPECT_EQ(choice.content, full.substr(0, full.find(stop)));
  EXPECT_LT(choice.completion_tokens, 40);
  // The engine ended it there: its slot is free and it counts as finished.
  for (int i = 0; i < 200 && (*engine)->stats().requests_finished < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ((*engine)->stats().requests_finished, 2);
  EXPECT_EQ((*engine)->stats().slots_busy, 0);
}

// A prompt given as token ids generates what its text generates; an id outside the vocabulary is
// refused naming 'prompt'.
TEST(GenerationServiceTest, APromptAsTokenIdsIsTheTextsTokens) {
  auto engine = LoadLlmEngine(Dir(), Overrides());
  ASSERT_TRUE(engine.ok());
  GenerationService service({{"m", *engine}});
  GenerateRequest request;
  request.prompt = "hello world";
  request.max_tokens = 12;
  request.ignore_eos = true;
  request.sampling.temperature = 0;
  const std::string from_text = Generate(service, request)->Joined(0).content;
  for (const int32_t id : (*engine)->tokenizer().Encode("hello world", true)) {
    request.prompt_tokens.push_back(id);
  }
  request.prompt = "something else";
  EXPECT_EQ(Generate(service, request)->Joined(0).content, from_text);
  request.prompt_tokens.push_back((*engine)->model().architecture().vocab_size);
  auto r = Generate(service, request);
  EXPECT_EQ(r->rejected.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r->rejected_param, "prompt");
}

TEST(GenerationServiceTest, ChoicesDifferAndASeedRepeatsThem) {
  auto engine = LoadLlmEngine(Dir(), Overrides());
  ASSERT_TRUE(engine.ok());
  GenerationService service({{"m", *engine}});
  GenerateRequest request;
  request.prompt = "hello world";
  request.max_tokens = 16;
  request.ignore_eos = true;
  request.n = 3;
  request.sampling.temperature = 1.5;
  request.sampling.seed = 7;
  auto first = Generate(service, request);
  auto second = Generate(service, request);
  EXPECT_TRUE(first->accepted);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first->Joined(i).content, second->Joined(i).content) << i;
    EXPECT_EQ(first->Joined(i).completion_tokens, 16);
  }
  EXPECT_NE(first->Joined(0).content, first->Joined(1).content);
}

TEST(GenerationServiceTest, AutoFindsTheTemplatesToolCallsInTheReply) {
  const std::string reply =
      "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"f\"}}\n"
      "</tool_call>";
  GenerationService service({{"m", Scripted(reply, kHermesTemplate)}});
  GenerateRequest request = Chat("weather in Paris?");
  request.tools = WeatherTool(ToolOptions::Choice::kAuto);
  request.max_tokens = 0;  // All the context leaves.
  // The reply read back as a call (the tiny model's 512 positions hold the tools, not the history).
  request.messages.resize(1);
  auto recorder = Generate(service, request);
  ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
  const ChoiceEvent choice = recorder->Joined(0);
  EXPECT_EQ(choice.content, "Let me check.");
  ASSERT_EQ(choice.tool_calls.size(), 2u);
  EXPECT_EQ(choice.tool_calls[0].name, "get_weather");
  EXPECT_EQ(choice.tool_calls[0].arguments, R"({"unit":"c"})");
  EXPECT_EQ(choice.tool_calls[1].arguments, R"({"unit":"f"})");
  EXPECT_EQ(choice.finish, FinishReason::kToolCalls);
  // The first call is given as soon as it closed, before the reply ended; numbered in order.
  bool early = false;
  for (const ChoiceEvent& e : recorder->events) {
    if (!e.tool_calls.empty() && e.finish == FinishReason::kNone) early = true;
    if (!e.tool_calls.empty()) {
      EXPECT_EQ(e.first_tool_call, e.tool_calls[0].arguments == R"({"unit":"c"})" ? 0 : 1);
    }
  }
  EXPECT_TRUE(early);

  // tool_choice none: the same reply is text.
  request.tools.choice = ToolOptions::Choice::kNone;
  const ChoiceEvent text = Generate(service, request)->Joined(0);
  EXPECT_EQ(text.content, reply);
  EXPECT_TRUE(text.tool_calls.empty());
  EXPECT_EQ(text.finish, FinishReason::kStop);
}

TEST(GenerationServiceTest, RequiredAndNamedCallsFollowTheFunctionsSchema) {
  auto engine = LoadLlmEngine(Dir(), Overrides());
  ASSERT_TRUE(engine.ok());
  auto with_tools = std::make_shared<LlmEngine>(
      LoadStepModel(Dir(), Overrides()).value(), Tokenizer::Load(Dir()).value(),
      ChatTemplate::Parse(kHermesTemplate).value(), (*engine)->config());
  GenerationService service({{"m", with_tools}});
  for (const ToolOptions::Choice mode :
       {ToolOptions::Choice::kRequired, ToolOptions::Choice::kFunction}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      GenerateRequest request = Chat("weather?");
      request.tools = WeatherTool(mode);
      request.tools.function = "get_weather";
      request.tools.parallel = false;
      request.max_tokens = 200;
      request.sampling.temperature = 1.0;
      request.sampling.seed = seed;
      auto recorder = Generate(service, request);
      ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
      const ChoiceEvent choice = recorder->Joined(0);
      EXPECT_EQ(choice.finish, FinishReason::kToolCalls);
      EXPECT_EQ(choice.content, "");
      ASSERT_EQ(choice.tool_calls.size(), 1u);  // parallel_tool_calls false: one.
      EXPECT_EQ(choice.tool_calls[0].name, "get_weather");
      simdjson::dom::parser parser;
      simdjson::dom::element arguments;
      ASSERT_EQ(parser.parse(choice.tool_calls[0].arguments).get(arguments), simdjson::SUCCESS);
      std::string_view unit;
      ASSERT_EQ(arguments["unit"].get(unit), simdjson::SUCCESS);
      EXPECT_TRUE(unit == "c" || unit == "f") << unit;
    }
  }
}

// Under auto, a strict function's calls follow its schema in Llama 3's, Mistral's (both forms)
// and the JSON fallback's formats too: the model's "kelvin" becomes a unit the schema allows.
TEST(GenerationServiceTest, AutoConstrainsStrictCallsInEveryFormat) {
  const std::string llama3 =
      "{{ tools }}{%- for message in messages %}{{ message.content }}{%- for call in "
      "message.tool_calls %}{\"name\": \"{{ call.function.name }}\", \"parameters\": "
      "{{ call.function.arguments | tojson }}}{%- endfor %}{%- endfor %}";
  const std::string mistral_array =
      "{{ tools }}{%- for message in messages %}{{ message.content }}{%- if message.tool_calls "
      "%}[TOOL_CALLS]{{ message.tool_calls | tojson }}{%- endif %}{%- endfor %}";
  const std::string mistral_named =
      "{{ tools }}{%- for message in messages %}{{ message.content }}{%- for call in "
      "message.tool_calls %}[TOOL_CALLS]{{ call.function.name }}[ARGS]{{ "
      "call.function.arguments | tojson }}{%- endfor %}{%- endfor %}";
  const std::string fallback =
      "{{ tools }}{%- for message in messages %}{{ message.content }}"
      "{%- endfor %}";
  const std::string deepseek =
      "{{ tools }}{%- for message in messages %}{{ message.content }}{%- for call in "
      "message.tool_calls %}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
      "{{ call.function.name }}\n```json\n{{ call.function.arguments | tojson }}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>{%- endfor %}{%- endfor %}";
  const std::pair<std::string, std::string> cases[] = {
      {llama3, "{\"name\": \"get_weather\", \"parameters\": {\"unit\": \"kelvin\"}}"},
      {mistral_array,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"kelvin\"}}]"},
      {mistral_named, "[TOOL_CALLS]get_weather[ARGS]{\"unit\": \"kelvin\"}"},
      {fallback, "{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"kelvin\"}}"},
      {deepseek,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
       "{\"unit\": \"kelvin\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
  };
  for (const auto& [source, reply] : cases) {
    GenerationService service({{"m", Scripted(reply, source)}});
    GenerateRequest request = Chat("weather?");
    request.max_tokens = 0;
    request.tools = WeatherTool(ToolOptions::Choice::kAuto);
    const ChoiceEvent loose = Generate(service, request)->Joined(0);
    ASSERT_EQ(loose.tool_calls.size(), 1u) << reply << " gave " << loose.content;
    EXPECT_EQ(loose.tool_calls[0].arguments, R"({"unit":"kelvin"})");
    request.tools.functions[0].strict = true;
    // One call: the scripted model, off its script once constrained, would not close an array.
    request.tools.parallel = false;
    auto strict = Generate(service, request);
    ASSERT_TRUE(strict->rejected.ok()) << strict->rejected.ToString();
    const ChoiceEvent choice = strict->Joined(0);
    ASSERT_EQ(choice.tool_calls.size(), 1u) << reply << " gave " << choice.content;
    EXPECT_TRUE(choice.tool_calls[0].arguments == R"({"unit":"c"})" ||
                choice.tool_calls[0].arguments == R"({"unit":"f"})")
        << reply << " gave " << choice.tool_calls[0].arguments;
  }
}

// Under auto, a strict function's calls follow its schema (XGrammar's structural tag) while the
// text around them stays free; without strict the model's own arguments are given as written.
TEST(GenerationServiceTest, AutoConstrainsAStrictFunctionsCalls) {
  const std::string reply =
      "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"kelvin\"}}"
      "\n</tool_call>";
  GenerationService service({{"m", Scripted(reply, kHermesTemplate)}});
  GenerateRequest request = Chat("weather?");
  request.max_tokens = 0;  // All the context leaves.
  request.tools = WeatherTool(ToolOptions::Choice::kAuto);
  ChoiceEvent loose = Generate(service, request)->Joined(0);
  EXPECT_EQ(loose.content, "Sure.");
  ASSERT_EQ(loose.tool_calls.size(), 1u);
  EXPECT_EQ(loose.tool_calls[0].arguments, R"({"unit":"kelvin"})");
  request.tools.functions[0].strict = true;
  auto strict = Generate(service, request);
  ASSERT_TRUE(strict->rejected.ok()) << strict->rejected.ToString();
  const ChoiceEvent choice = strict->Joined(0);
  EXPECT_EQ(choice.content, "Sure.");
  ASSERT_EQ(choice.tool_calls.size(), 1u) << choice.content;
  EXPECT_EQ(choice.tool_calls[0].name, "get_weather");
  EXPECT_TRUE(choice.tool_calls[0].arguments == R"({"unit":"c"})" ||
              choice.tool_calls[0].arguments == R"({"unit":"f"})")
      << choice.tool_calls[0].arguments;
}

// A thinking template (it opens <think> in the prompt and writes an assistant's
// reasoning_content back inside the block).
std::string ThinkingTemplate() {
  std::string source = kHermesTemplate;
  const std::string prompt_end = "<|im_start|>assistant\n{%- endif %}";
  source.replace(source.rfind(prompt_end), prompt_end.size(),
                 "<|im_start|>assistant\n<think>\n{%- endif %}");
  const std::string plain = "{%- else %}<|im_start|>{{ message.role }}\n";
  source.replace(source.find(plain), plain.size(),
                 plain +
                     "{%- if message.reasoning_content %}<think>{{ message.reasoning_content }}"
                     "</think>{%- endif %}");
  return source;
}

// With a thinking template, a schema, a required call or a named one applies after the reasoning:
// the block's text is free, and the JSON lands in the answer, not in reasoning_content.
TEST(GenerationServiceTest, AThinkingReplysJsonFollowsItsReasoning) {
  GenerateRequest request = Chat("weather?");
  request.max_tokens = 0;
  request.response_format.type = ResponseFormat::Type::kJsonSchema;
  request.response_format.schema =
      R"({"type":"object","properties":{"unit":{"enum":["c","f"]}},"required":["unit"]})";
  {
    GenerationService service(
        {{"m", Scripted("Cold, so celsius.</think>{\"unit\": \"c\"}", ThinkingTemplate())}});
    auto recorder = Generate(service, request);
    ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
    const ChoiceEvent choice = recorder->Joined(0);
    EXPECT_EQ(choice.reasoning, "Cold, so celsius.");
    EXPECT_EQ(choice.content, R"({"unit": "c"})");
    EXPECT_EQ(choice.finish, FinishReason::kStop);
  }
  request.response_format = {};
  request.tools = WeatherTool(ToolOptions::Choice::kRequired);
  GenerationService service(
      {{"m", Scripted("Call it.</think>[{\"name\": \"get_weather\", \"arguments\": "
                      "{\"unit\": \"f\"}}]",
                      ThinkingTemplate())}});
  // The reply read back as a call (the tiny model's 512 positions hold the tools, not the history).
  request.messages.resize(1);
  auto recorder = Generate(service, request);
  ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
  const ChoiceEvent choice = recorder->Joined(0);
  EXPECT_EQ(choice.reasoning, "Call it.");
  EXPECT_EQ(choice.content, "");
  ASSERT_EQ(choice.tool_calls.size(), 1u);
  EXPECT_EQ(choice.tool_calls[0].arguments, R"({"unit":"f"})");
  EXPECT_EQ(choice.finish, FinishReason::kToolCalls);

  // The reply's reasoning sent back in the history reaches the template.
  std::string name = "m";
  GenerateRequest next = Chat("and tomorrow?");
  next.messages.insert(next.messages.begin(), 2, next.messages[0]);
  next.messages[0].content = "weather?";
  next.messages[1].role = "assistant";
  next.messages[1].content = "Cold.";
  next.messages[1].reasoning_content = "It is winter.";
  auto rendered = GenerationService::RenderChat(**service.Find(name), next.messages, true);
  ASSERT_TRUE(rendered.ok());
  EXPECT_NE(rendered->find("<think>It is winter.</think>Cold."), std::string::npos) << *rendered;
}

// gpt-oss's chat format (harmony; a template of its form, whose prompt leaves the tiny model's
// 512 positions room: gpt-oss's own is harmony_test's): the analysis channel is
// reasoning_content, a message to functions.NAME a tool call, the final channel the answer; a
// grammar (a forced call, a response format) over a vocabulary without harmony's markers as
// tokens (tiny_llm's) is refused naming the parameter (HarmonyRepliesFollowTheirGrammars: with
// them).
constexpr const char* kHarmonyTemplate =
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|start|>assistant to=functions."
    "{{ message.tool_calls[0].function.name }}<|channel|>commentary json<|message|>"
    "{{ message.tool_calls[0].function.arguments | tojson }}<|call|>"
    "{%- else %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>{%- endif %}"
    "{%- endfor %}{%- if tools %}<|start|>developer<|message|>{{ tools | tojson }}<|end|>"
    "{%- endif %}{%- if add_generation_prompt %}<|start|>assistant{%- endif %}";

TEST(GenerationServiceTest, HarmonyRepliesGiveReasoningCallsAndAnswer) {
  GenerateRequest request = Chat("weather?");
  request.max_tokens = 0;
  request.tools = WeatherTool(ToolOptions::Choice::kAuto);
  {
    GenerationService service(
        {{"m", Scripted("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                        "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                        "<|message|>{\"unit\": \"c\"}<|call|>",
                        kHarmonyTemplate)}});
    auto recorder = Generate(service, request);
    ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
    const ChoiceEvent choice = recorder->Joined(0);
    EXPECT_EQ(choice.reasoning, "Need the weather.");
    EXPECT_EQ(choice.content, "");
    ASSERT_EQ(choice.tool_calls.size(), 1u);
    EXPECT_EQ(choice.tool_calls[0].name, "get_weather");
    EXPECT_EQ(choice.tool_calls[0].arguments, R"({"unit":"c"})");
    EXPECT_EQ(choice.finish, FinishReason::kToolCalls);
  }
  GenerationService service(
      {{"m", Scripted("<|channel|>analysis<|message|>Mild.<|end|><|start|>assistant"
                      "<|channel|>final<|message|>It is 18 C.<|return|>",
                      kHarmonyTemplate)}});
  request.tools = {};
  auto recorder = Generate(service, request);
  ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
  const ChoiceEvent answer = recorder->Joined(0);
  EXPECT_EQ(answer.reasoning, "Mild.");
  EXPECT_EQ(answer.content, "It is 18 C.");
  EXPECT_TRUE(answer.tool_calls.empty());

  request.tools = WeatherTool(ToolOptions::Choice::kRequired);
  EXPECT_EQ(Generate(service, request)->rejected_param, "tool_choice");
  request.tools = {};
  request.response_format.type = ResponseFormat::Type::kJsonObject;
  EXPECT_EQ(Generate(service, request)->rejected_param, "response_format");
}

// On a harmony vocabulary (the tiny gpt-oss's), a grammar leaves the analysis message free and
// constrains what follows it: a response format's document as the final message, a forced call
// (required, a named function) or, under auto, a strict function's call, each in harmony's form;
// the scripted model's "kelvin" becomes a unit the schema allows, its reasoning is kept, and a
// reply that skips the analysis is taken as it is.
TEST(GenerationServiceTest, HarmonyRepliesFollowTheirGrammars) {
  const std::string dir = std::string(SLUICE_TEST_MODELS) + "/converted/hf_gpt_oss";
  const std::string analysis = "<|channel|>analysis<|message|>Cold.<|end|><|start|>assistant";
  const std::string call =
      "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"unit\": \"kelvin\"}<|call|>";
  const auto celsius_or_fahrenheit = [](const std::string& json) {
    return json.find("\"unit\": \"c\"") != std::string::npos ||
           json.find("\"unit\": \"f\"") != std::string::npos || json == R"({"unit":"c"})" ||
           json == R"({"unit":"f"})";
  };
  GenerateRequest request = Chat("weather?");
  request.max_tokens = 0;
  request.response_format.type = ResponseFormat::Type::kJsonSchema;
  request.response_format.schema =
      R"({"type":"object","properties":{"unit":{"enum":["c","f"]}},"required":["unit"]})";
  for (const std::string& before : {analysis, std::string()}) {
    GenerationService service(
        {{"m", Scripted(before + "<|channel|>final<|message|>{\"unit\": \"kelvin\"}<|return|>",
                        kHarmonyTemplate, dir)}});
    auto recorder = Generate(service, request);
    ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
    const ChoiceEvent choice = recorder->Joined(0);
    EXPECT_EQ(choice.reasoning, before.empty() ? "" : "Cold.");
    EXPECT_TRUE(celsius_or_fahrenheit(choice.content)) << choice.content;
    EXPECT_EQ(choice.finish, FinishReason::kStop);
  }
  request.response_format = {};
  for (const auto choice_kind : {ToolOptions::Choice::kRequired, ToolOptions::Choice::kFunction,
                                 ToolOptions::Choice::kAuto}) {
    request.tools = WeatherTool(choice_kind);
    if (choice_kind == ToolOptions::Choice::kFunction) request.tools.function = "get_weather";
    if (choice_kind == ToolOptions::Choice::kAuto) request.tools.functions[0].strict = true;
    GenerationService service({{"m", Scripted(analysis + call, kHarmonyTemplate, dir)}});
    auto recorder = Generate(service, request);
    ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
    const ChoiceEvent choice = recorder->Joined(0);
    EXPECT_EQ(choice.reasoning, "Cold.");
    EXPECT_EQ(choice.content, "");
    ASSERT_EQ(choice.tool_calls.size(), 1u) << static_cast<int>(choice_kind) << choice.content;
    EXPECT_EQ(choice.tool_calls[0].name, "get_weather");
    EXPECT_TRUE(celsius_or_fahrenheit(choice.tool_calls[0].arguments))
        << choice.tool_calls[0].arguments;
    EXPECT_EQ(choice.finish, FinishReason::kToolCalls);
  }
  // Under auto with a strict function, an answer instead of a call stays free.
  GenerationService answers(
      {{"m", Scripted(analysis + "<|channel|>final<|message|>It is 18 C.<|return|>",
                      kHarmonyTemplate, dir)}});
  const ChoiceEvent answer = Generate(answers, request)->Joined(0);
  EXPECT_EQ(answer.reasoning, "Cold.");
  EXPECT_EQ(answer.content, "It is 18 C.");
  EXPECT_TRUE(answer.tool_calls.empty());
}

// A harmony vocabulary (the tiny gpt-oss's, with harmony's markers as special tokens): the reply
// ends at <|call|> or <|return|>, not at the <|end|> of its reasoning, though its file names
// neither as its end of sequence; the text the script holds after them is never generated.
TEST(GenerationServiceTest, HarmonyRepliesEndAtCallOrReturn) {
  const std::string dir = std::string(SLUICE_TEST_MODELS) + "/converted/hf_gpt_oss";
  GenerateRequest request = Chat("weather?");
  request.max_tokens = 100;
  request.tools = WeatherTool(ToolOptions::Choice::kAuto);
  const std::string call =
      "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"unit\": \"f\"}<|call|>";
  GenerationService calls({{"m", Scripted(call + "after the call", kHarmonyTemplate, dir)}});
  auto recorder = Generate(calls, request);
  ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
  const ChoiceEvent choice = recorder->Joined(0);
  EXPECT_EQ(choice.reasoning, "Need it.");
  ASSERT_EQ(choice.tool_calls.size(), 1u);
  EXPECT_EQ(choice.tool_calls[0].arguments, R"({"unit":"f"})");
  EXPECT_EQ(choice.content, "");
  EXPECT_EQ(choice.finish, FinishReason::kToolCalls);
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ(choice.completion_tokens,
            static_cast<int>((*tokenizer)->Encode(call, /*add_special_tokens=*/false).size()));

  request.tools = {};
  GenerationService answers(
      {{"m", Scripted("<|channel|>analysis<|message|>Mild.<|end|><|start|>assistant<|channel|>"
                      "final<|message|>18 C.<|return|>after the answer",
                      kHarmonyTemplate, dir)}});
  const ChoiceEvent answer = Generate(answers, request)->Joined(0);
  EXPECT_EQ(answer.reasoning, "Mild.");
  EXPECT_EQ(answer.content, "18 C.");
  EXPECT_EQ(answer.finish, FinishReason::kStop);
}

// A required call cut by the token limit (a small model repeating its call) gives the calls it
// completed, finish_reason length, and never the array's text as content.
TEST(GenerationServiceTest, ACutRequiredReplyGivesItsCompleteCalls) {
  const std::string call = R"({"name": "get_weather", "arguments": {"unit": "c"}})";
  const std::string reply = "[" + call + ", " + call + ", " + call + "]";
  auto tokenizer = Tokenizer::Load(Dir());
  ASSERT_TRUE(tokenizer.ok());
  const std::string cut = "[" + call + ", " + call + ", {\"name\": \"get_";
  GenerationService service({{"m", Scripted(reply, kHermesTemplate)}});
  GenerateRequest request = Chat("weather?");
  request.tools = WeatherTool(ToolOptions::Choice::kRequired);
  request.max_tokens = static_cast<int>((*tokenizer)->Encode(cut, false).size());
  // The reply read back as a call (the tiny model's 512 positions hold the tools, not the history).
  request.messages.resize(1);
  auto recorder = Generate(service, request);
  ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
  const ChoiceEvent choice = recorder->Joined(0);
  EXPECT_EQ(choice.finish, FinishReason::kLength);
  EXPECT_EQ(choice.content, "");
  ASSERT_EQ(choice.tool_calls.size(), 2u);
  EXPECT_EQ(choice.tool_calls[1].arguments, R"({"unit":"c"})");
}

// parallel_tool_calls false bounds a found format too: the reply ends with its first call.
TEST(GenerationServiceTest, OneCallWithoutParallelCallsInEveryFormat) {
  const std::string hermes =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": "
      "\"f\"}}\n</tool_call>";
  const std::string mistral =
      "[TOOL_CALLS]get_weather[ARGS]{\"unit\": \"c\"}[TOOL_CALLS]get_weather[ARGS]{\"unit\": "
      "\"f\"}";
  const std::string mistral_template =
      "{{ tools }}{%- for message in messages %}{{ message.content }}{%- for call in "
      "message.tool_calls %}[TOOL_CALLS]{{ call.function.name }}{%- endfor %}{%- endfor %}";
  for (const auto& [reply, source] : {std::pair<std::string, std::string>{hermes, kHermesTemplate},
                                      {mistral, mistral_template}}) {
    GenerationService service({{"m", Scripted(reply, source)}});
    GenerateRequest request = Chat("weather?");
    request.max_tokens = 0;
    request.tools = WeatherTool(ToolOptions::Choice::kAuto);
    ChoiceEvent both = Generate(service, request)->Joined(0);
    ASSERT_EQ(both.tool_calls.size(), 2u) << reply;
    request.tools.parallel = false;
    ChoiceEvent one = Generate(service, request)->Joined(0);
    ASSERT_EQ(one.tool_calls.size(), 1u) << reply;
    EXPECT_EQ(one.tool_calls[0].arguments, R"({"unit":"c"})");
    EXPECT_EQ(one.finish, FinishReason::kToolCalls);
    // Mistral's templates refuse ids but 9 letters and digits.
    EXPECT_EQ(one.tool_calls[0].id.size(), source == mistral_template ? 9u : 29u);
  }
}

TEST(GenerationServiceTest, WhatToolCallingNeedsIsCheckedFirst) {
  // The tiny model's own template renders no tools.
  auto plain = LoadLlmEngine(Dir(), Overrides());
  ASSERT_TRUE(plain.ok());
  GenerationService service({{"m", *plain},
                             {"unknown_format", Scripted("x", "{{ tools }}{{ messages }}")},
                             {"hermes", Scripted("x", kHermesTemplate)},
                             {"mistral", Scripted("x", "{{ tools }}[TOOL_CALLS]{{ messages }}")}});
  GenerateRequest request = Chat("hi");
  request.tools = WeatherTool(ToolOptions::Choice::kAuto);
  // A template that renders no tools is given them in the conversation.
  request.max_tokens = 8;
  EXPECT_TRUE(Generate(service, request, "m")->rejected.ok());
  // A template with no known call format is served under auto: its replies are read with the
  // JSON fallback.
  request.max_tokens = 8;
  EXPECT_TRUE(Generate(service, request, "unknown_format")->rejected.ok());
  request.tools.choice = ToolOptions::Choice::kRequired;
  EXPECT_TRUE(Generate(service, request, "unknown_format")->rejected.ok());
  // Strict functions under auto are constrained in every format.
  request.tools = WeatherTool(ToolOptions::Choice::kAuto);
  request.tools.functions[0].strict = true;
  request.max_tokens = 8;
  for (const char* model : {"mistral", "unknown_format", "hermes"}) {
    EXPECT_TRUE(Generate(service, request, model)->rejected.ok()) << model;
  }
  request.tools.functions[0].strict = false;
  request.response_format.type = ResponseFormat::Type::kJsonObject;
  EXPECT_EQ(Generate(service, request, "hermes")->rejected_param, "response_format");
}

TEST(GenerationServiceTest, ATemplateThatRendersNoToolsIsGivenThemAndItsCallsAreRead) {
  // Gemma's form: no system role, turns that alternate, no tools.
  const std::string gemma =
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
      "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}"
      "{% endif %}<turn>{{ message['role'] }}\n{{ message['content'] }}</turn>\n{% endfor %}"
      "{% if add_generation_prompt %}<turn>model\n{% endif %}";
  GenerationService service(
      {{"m", Scripted(R"([{"name": "get_weather", "arguments": {"unit": "c"}}])", gemma)}});
  GenerateRequest request = Chat("weather?");
  request.tools = WeatherTool(ToolOptions::Choice::kAuto);
  ChatMessage call;
  call.role = "assistant";
  call.tool_calls.push_back({"call_1", "get_weather", R"({"unit": "f"})"});
  ChatMessage result;
  result.role = "tool";
  result.tool_call_id = "call_1";
  result.content = "64 F";
  request.messages.push_back(call);
  request.messages.push_back(result);
  std::string name = "m";
  auto engine = service.Find(name);
  ASSERT_TRUE(engine.ok());
  auto prompt = GenerationService::RenderRequest(**engine, request);
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(prompt->find("<turn>user\nYou can call these functions"), 0u) << *prompt;
  EXPECT_NE(prompt->find(request.tools.definitions), std::string::npos);
  EXPECT_NE(prompt->find("<turn>user\nResult of get_weather:\n64 F</turn>\n<turn>model\n"),
            std::string::npos)
      << *prompt;
  // The reply read back as a call (the tiny model's 512 positions hold the tools, not the history).
  request.messages.resize(1);
  auto recorder = Generate(service, request);
  ASSERT_TRUE(recorder->rejected.ok()) << recorder->rejected.ToString();
  ChoiceEvent reply = recorder->Joined(0);
  ASSERT_EQ(reply.tool_calls.size(), 1u) << reply.content;
  EXPECT_EQ(reply.tool_calls[0].name, "get_weather");
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"unit":"c"})");
  EXPECT_EQ(reply.finish, FinishReason::kToolCalls);
  EXPECT_EQ(reply.content, "");
}

}  // namespace
}  // namespace sluice::llm
