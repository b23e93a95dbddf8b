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

// WaitForLoad's side of a request waiting for its model: a fake load waiter keeps the resumes, a
// Poster runs work at once (on the thread that resumes), and a disconnect is fired by hand.
class WaitForLoadTest : public ::testing::Test {
 protected:
  WaitForLoadTest() : service_({}) {
    service_.SetLoadWaiter([this](const std::string& model, std::function<void()> resume) {
      if (!accept_) return false;
      waited_for_.push_back(model);
      resumes_.push_back(std::move(resume));
      return true;
    });
    request_.body = "the body";
    request_.post = [](std::function<void()> work) { work(); };
    request_.on_disconnect = [this](std::function<void()> cancel) {
      ++disconnect_registrations_;
      disconnect_ = std::move(cancel);
    };
  }

  // A responder that counts its answers and keeps the last.
  Responder Counting() {
    return [this](HttpResponse response) {
      ++answers_;
      last_ = std::move(response);
    };
  }

  llm::GenerationService service_;
  bool accept_ = true;
  std::vector<std::string> waited_for_;
  std::vector<std::function<void()>> resumes_;
  HttpRequest request_;
  int disconnect_registrations_ = 0;
  std::function<void()> disconnect_;
  int answers_ = 0;
  HttpResponse last_;
  const Status loading_ = Status::Unavailable("language model 'm' is loading");
};

TEST_F(WaitForLoadTest, OnlyALoadingModelsRequestWaitsAndTheRespondStaysOtherwise) {
  Responder respond = Counting();
  int runs = 0;
  auto again = [&](const HttpRequest&, Responder) { ++runs; };
  EXPECT_FALSE(WaitForLoad(service_, Status::NotFound("no model 'm'"), "m", request_, respond,
                           again));
  accept_ = false;  // The model is not loading (or too many wait).
  EXPECT_FALSE(WaitForLoad(service_, loading_, "m", request_, respond, again));
  ASSERT_TRUE(respond);
  respond(HttpResponse::Json(503, "{}"));
  EXPECT_EQ(answers_, 1);
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(disconnect_registrations_, 0);
  // A request run again after its wait waits no more: Find's answer then stands.
  accept_ = true;
  HttpRequest again_request = request_;
  again_request.waited_for_load = true;
  Responder second = Counting();
  EXPECT_FALSE(WaitForLoad(service_, loading_, "m", again_request, second, again));
  EXPECT_TRUE(waited_for_.empty());
}

TEST_F(WaitForLoadTest, TheRequestRunsAgainOnceWithItsBodyAndItsOneAnswer) {
  Responder respond = Counting();
  std::vector<std::string> bodies;
  auto again = [&](const HttpRequest& r, Responder d) {
    EXPECT_TRUE(r.waited_for_load);
    bodies.push_back(r.body);
    d(HttpResponse::Json(200, "{}"));
  };
  ASSERT_TRUE(WaitForLoad(service_, loading_, "m", request_, respond, again));
  EXPECT_EQ(waited_for_, std::vector<std::string>{"m"});
  EXPECT_EQ(disconnect_registrations_, 1);  // Watched while it waits.
  EXPECT_EQ(answers_, 0);
  ASSERT_EQ(resumes_.size(), 1u);
  resumes_[0]();
  EXPECT_EQ(bodies, std::vector<std::string>{"the body"});
  EXPECT_EQ(answers_, 1);
  EXPECT_EQ(last_.status, 200);
}

TEST_F(WaitForLoadTest, AClientThatLeavesWhileItWaitsIsNotRunAgain) {
  Responder respond = Counting();
  int runs = 0;
  ASSERT_TRUE(WaitForLoad(service_, loading_, "m", request_, respond,
                          [&](const HttpRequest&, Responder) { ++runs; }));
  ASSERT_TRUE(disconnect_);
  disconnect_();
  resumes_[0]();
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(answers_, 1);  // Still one answer, for the connection's accounting.
  EXPECT_EQ(last_.status, 499);  // Client closed request.
}

TEST_F(WaitForLoadTest, ALeaveAfterTheSecondRunCancelsWhatItStarted) {
  Responder respond = Counting();
  int cancels = 0;
  Responder kept;
  ASSERT_TRUE(WaitForLoad(service_, loading_, "m", request_, respond,
                          [&](const HttpRequest& r, Responder d) {
                            r.on_disconnect([&] { ++cancels; });
                            kept = std::move(d);  // Still generating.
                          }));
  resumes_[0]();
  EXPECT_EQ(cancels, 0);
  disconnect_();
  EXPECT_EQ(cancels, 1);
  kept(HttpResponse::Json(200, "{}"));
  EXPECT_EQ(answers_, 1);
}

}  // namespace
}  // namespace sluice
