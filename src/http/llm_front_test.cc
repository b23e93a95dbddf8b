#include "http/llm_front.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace sluice {
namespace {

// Records where and in what order each of its methods ran.
class RecordingWriter final : public EventWriter {
 public:
  struct Call {
    std::string what;
    std::thread::id thread;
  };
  std::vector<Call> calls;

  std::string StreamChoice(const llm::ChoiceEvent& event, bool last) override {
    Note("stream " + event.content + (last ? " last" : ""));
    return "[" + event.content + "]";
  }
  std::string StreamFailure(const Status& error) override {
    Note("failure");
    return "{" + error.message() + "}";
  }
  void Add(const llm::ChoiceEvent& event) override {
    Note("add " + event.content);
    body_ += event.content;
  }
  std::string Body() override {
    Note("body");
    return body_;
  }

 private:
  void Note(std::string what) { calls.push_back({std::move(what), std::this_thread::get_id()}); }
  std::string body_;
};

class TestReply final : public FrontReply {
 public:
  using FrontReply::FrontReply;

 private:
  HttpResponse Error(const Status& status, std::string_view, double) const override {
    return HttpResponse::Error(status);
  }
};

class CountingGeneration final : public llm::Generation {
 public:
  void Cancel() override { ++cancels; }
  int cancels = 0;
};

llm::ChoiceEvent Event(size_t index, std::string content, bool finish) {
  llm::ChoiceEvent event;
  event.index = index;
  event.content = std::move(content);
  if (finish) event.finish = llm::FinishReason::kStop;
  return event;
}

// The engine's loop, as the front sees it: events from a thread of their own.
template <typename Work>
std::thread::id OnEngineThread(Work work) {
  std::thread::id id;
  std::thread engine([&] {
    id = std::this_thread::get_id();
    work();
  });
  engine.join();
  return id;
}

TEST(FrontReplyTest, AStreamsEventsAreRenderedWhenTheConnectionTakesThemNotOnTheEngineLoop) {
  auto writer = std::make_shared<RecordingWriter>();
  auto reply = std::make_shared<TestReply>(writer, 2);
  std::vector<HttpResponse> answers;
  reply->respond = [&](HttpResponse response) { answers.push_back(std::move(response)); };
  reply->stream = std::make_shared<ResponseStream>();
  OnEngineThread([&] {
    reply->OnChoice(Event(0, "a", false));
    reply->OnAccepted();
    reply->OnChoice(Event(1, "b", true));
    reply->OnChoice(Event(0, "c", true));  // The second choice to end: the reply's last.
  });
  EXPECT_TRUE(writer->calls.empty());  // Nothing rendered on the engine's loop.
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].stream, reply->stream);
  bool closed = false;
  EXPECT_EQ(reply->stream->Take(&closed), "[a][b][c]");
  EXPECT_TRUE(closed);
  ASSERT_EQ(writer->calls.size(), 3u);
  EXPECT_EQ(writer->calls[1].what, "stream b");
  EXPECT_EQ(writer->calls[2].what, "stream c last");
  for (const auto& call : writer->calls) EXPECT_EQ(call.thread, std::this_thread::get_id());
}

TEST(FrontReplyTest, AWholeReplysBodyIsBuiltWhenTheConnectionSendsIt) {
  auto writer = std::make_shared<RecordingWriter>();
  auto reply = std::make_shared<TestReply>(writer, 1);
  std::vector<HttpResponse> answers;
  reply->respond = [&](HttpResponse response) { answers.push_back(std::move(response)); };
  const std::thread::id engine = OnEngineThread([&] {
    reply->OnAccepted();
    reply->OnChoice(Event(0, "x", false));
    reply->OnChoice(Event(0, "y", true));
  });
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].body.empty());
  ASSERT_TRUE(answers[0].render);
  // Kept on the engine's loop (no JSON there); the body waits for the connection.
  ASSERT_EQ(writer->calls.size(), 2u);
  EXPECT_EQ(writer->calls[1].thread, engine);
  EXPECT_EQ(answers[0].render(), "xy");
  EXPECT_EQ(writer->calls.back().what, "body");
  EXPECT_EQ(writer->calls.back().thread, std::this_thread::get_id());
}

TEST(FrontReplyTest, AFailureEndsTheStreamWithTheWritersErrorAndNothingAfterIt) {
  auto writer = std::make_shared<RecordingWriter>();
  auto reply = std::make_shared<TestReply>(writer, 1);
  reply->respond = [](HttpResponse) {};
  reply->stream = std::make_shared<ResponseStream>();
  OnEngineThread([&] {
    reply->OnChoice(Event(0, "a", false));
    reply->OnFailed(Status::Internal("broke"));
    reply->OnChoice(Event(0, "late", true));
  });
  bool closed = false;
  EXPECT_EQ(reply->stream->Take(&closed), "[a]{broke}");
  EXPECT_TRUE(closed);

  // Not streaming: the failure is the one answer, in the front's error shape.
  auto whole = std::make_shared<TestReply>(std::make_shared<RecordingWriter>(), 1);
  std::vector<HttpResponse> answers;
  whole->respond = [&](HttpResponse response) { answers.push_back(std::move(response)); };
  whole->OnFailed(Status::Internal("broke"));
  whole->OnChoice(Event(0, "late", true));
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].status, 500);
  EXPECT_FALSE(answers[0].render);
}

TEST(FrontReplyTest, AClientTooSlowToReadCancelsTheGeneration) {
  auto writer = std::make_shared<RecordingWriter>();
  auto reply = std::make_shared<TestReply>(writer, 1);
  reply->respond = [](HttpResponse) {};
  reply->stream = std::make_shared<ResponseStream>();
  auto generation = std::make_shared<CountingGeneration>();
  reply->Attach(generation);
  reply->OnChoice(Event(0, "a", false));
  EXPECT_EQ(generation->cancels, 0);
  llm::ChoiceEvent big = Event(0, std::string(ResponseStream::kMaxPendingBytes, 'x'), false);
  reply->OnChoice(big);  // Counted past the bound: the client is gone, never taken.
  EXPECT_TRUE(reply->stream->client_gone());
  EXPECT_EQ(generation->cancels, 1);
  EXPECT_TRUE(writer->calls.empty());
}

}  // namespace
}  // namespace sluice
