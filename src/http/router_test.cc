// Route table and response helpers, without sockets.
#include "http/router.h"

#include <gtest/gtest.h>

#include "metrics/prometheus.h"

namespace sluice {
namespace {

HttpResponse Dispatch(const Router& router, std::string method, std::string path) {
  HttpRequest request;
  request.method = std::move(method);
  request.path = std::move(path);
  HttpResponse out;
  int calls = 0;
  router.Dispatch(request, [&](HttpResponse r) {
    out = std::move(r);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  return out;
}

TEST(RouterTest, MatchesLiteralsAndCapturesParameters) {
  Router router;
  router.Get("/v2/models/{model}/versions/{version}",
             [](const HttpRequest&, const PathParams& p, Responder respond) {
               respond(HttpResponse::Json(
                   200, std::string(p.Get("model")) + "@" + std::string(p.Get("version"))));
             });
  router.Get("/v2/models/{model}", [](const HttpRequest&, const PathParams& p, Responder respond) {
    respond(HttpResponse::Json(200, std::string(p.Get("model"))));
  });
  EXPECT_EQ(Dispatch(router, "GET", "/v2/models/m/versions/3").body, "m@3");
  EXPECT_EQ(Dispatch(router, "GET", "/v2/models/m").body, "m");
  EXPECT_EQ(Dispatch(router, "GET", "/v2/models/m/").body, "m");  // Trailing slash.
  EXPECT_EQ(Dispatch(router, "GET", "/v2/models").status, 404);
  EXPECT_EQ(Dispatch(router, "GET", "/v2/models/m/versions/3/x").status, 404);
}

// Admission runs on the header alone: the route's check sees the path's parameters; routes
// without one, other methods and unknown paths are admitted (Dispatch answers those).
TEST(RouterTest, AdmissionChecksTheMatchingRouteBeforeItsBody) {
  Router router;
  auto ok = [](const HttpRequest&, const PathParams&, Responder respond) {
    respond(HttpResponse::Json(200, "{}"));
  };
  router.Post("/v2/models/{model}/infer", ok);
  router.Get("/v2/models/{model}/infer", ok);
  router.Post("/v2/health", ok);
  std::vector<std::string> asked;
  auto ticket = std::make_shared<int>(7);
  router.SetAdmission(
      "POST", "/v2/models/{model}/infer", [&](const PathParams& params) -> Result<AdmissionTicket> {
        asked.emplace_back(params.Get("model"));
        if (params.Get("model") == "busy") {
          return Status::Unavailable("predicted queue wait too long").WithRetryAfter(2.0);
        }
        return AdmissionTicket(ticket);
      });
  Result<AdmissionTicket> idle = router.Admit("POST", "/v2/models/idle/infer");
  ASSERT_TRUE(idle.ok());
  EXPECT_EQ(idle->get(), ticket.get());  // The route's ticket, for the request to hold.
  const Status busy = router.Admit("POST", "/v2/models/busy/infer").status();
  EXPECT_EQ(busy.code(), StatusCode::kUnavailable);
  EXPECT_EQ(busy.retry_after_seconds(), 2.0);
  EXPECT_EQ(asked, (std::vector<std::string>{"idle", "busy"}));
  EXPECT_TRUE(router.Admit("GET", "/v2/models/busy/infer").ok());
  EXPECT_TRUE(router.Admit("POST", "/v2/health").ok());
  EXPECT_TRUE(router.Admit("POST", "/nowhere").ok());
  EXPECT_EQ(asked.size(), 2u);
  // The refusal as the server writes it: 503 with Retry-After.
  const HttpResponse response = HttpResponse::Error(busy);
  EXPECT_EQ(response.status, 503);
  EXPECT_NE(std::find(response.headers.begin(), response.headers.end(),
                      std::pair<std::string, std::string>("Retry-After", "2")),
            response.headers.end());
}

TEST(RouterTest, MemoryBudgetRefusalNamesWhatWasAskedAndWhatIsHeld) {
  MemoryBudget budget(1000);
  MemoryReservation held(budget);
  ASSERT_TRUE(held.Grow(900));
  MemoryReservation request(budget);
  EXPECT_FALSE(request.Grow(200));
  const Status status = MemoryBudgetExceeded(request, 200);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.message(),
            "the server's memory budget is full: this request needs 200 more bytes; 900 of 1000 "
            "are held by requests in flight");
  EXPECT_GE(status.retry_after_seconds(), 1.0);
}

TEST(RouterTest, WrongMethodIs405WithAllow) {
  Router router;
  auto ok = [](const HttpRequest&, const PathParams&, Responder respond) {
    respond(HttpResponse::Json(200, "{}"));
  };
  router.Post("/infer", ok);
  router.Get("/infer", ok);
  router.Get("/only-get", ok);
  EXPECT_EQ(Dispatch(router, "PUT", "/infer").headers,
            (std::vector<std::pair<std::string, std::string>>{{"Allow", "POST, GET"}}));
  HttpResponse r = Dispatch(router, "DELETE", "/only-get");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.body, R"({"error":"method DELETE is not allowed here; use GET"})");
}

TEST(RouterTest, ErrorsAreJsonWithTheRightStatusAndEscaping) {
  HttpResponse busy = HttpResponse::Error(Status::Unavailable("queue full"));
  EXPECT_EQ(busy.status, 503);
  EXPECT_EQ(busy.body, R"({"error":"queue full"})");
  EXPECT_EQ(busy.headers.at(0).first, "Retry-After");
  EXPECT_EQ(busy.headers.at(0).second, "1");  // Unknown: one second.
  HttpResponse later = HttpResponse::Error(Status::Unavailable("wait").WithRetryAfter(2.3));
  EXPECT_EQ(later.headers.at(0).second, "3");  // Whole seconds, rounded up.
  HttpResponse bad = HttpResponse::Error(Status::InvalidArgument("bad \"x\"\n"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body, R"({"error":"bad \"x\"\n"})");
  EXPECT_EQ(HttpResponse::Error(Status::DeadlineExceeded("late")).status, 504);
  EXPECT_EQ(HttpResponse::Error(Status::PayloadTooLarge("big")).status, 413);
  EXPECT_EQ(HttpResponse::Error(Status::Internal("boom")).status, 500);
}

TEST(PrometheusTest, HistogramsAreCumulativeWithSumAndCount) {
  PrometheusWriter w;
  HistogramSnapshot h;
  h.upper_bounds = {1, 2};
  h.counts = {3, 1, 2};
  h.count = 6;
  h.sum = 20;
  w.Family("x_seconds", "histogram", "Test.");
  w.Histogram("x_seconds", "model=\"m\"", h);
  EXPECT_EQ(w.text(),
            "# HELP x_seconds Test.\n# TYPE x_seconds histogram\n"
            "x_seconds_bucket{model=\"m\",le=\"1\"} 3\n"
            "x_seconds_bucket{model=\"m\",le=\"2\"} 4\n"
            "x_seconds_bucket{model=\"m\",le=\"+Inf\"} 6\n"
            "x_seconds_sum{model=\"m\"} 20\n"
            "x_seconds_count{model=\"m\"} 6\n");
  EXPECT_EQ(LabelValue("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
}

TEST(PrometheusTest, RendersEveryModelSeries) {
  ModelStatsSnapshot s;
  s.requests_by_outcome[static_cast<int>(StatusCode::kOk)] = 7;
  s.queued_requests = 2;
  s.instances = 2;
  s.batch_size.upper_bounds = {1, 2};
  s.batch_size.counts = {1, 1, 0};
  s.batch_size.count = 2;
  s.target_batch_size = 32;
  s.batch_costs = {{8, 0.004, 3}, {32, 0.012, 5}};
  std::string text = RenderMetrics({{"fashion", s}}, HttpStats{});
  EXPECT_NE(text.find("sluice_batch_target_size{model=\"fashion\"} 32\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_batch_cost_seconds{model=\"fashion\",batch_size=\"32\"} 0.012\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sluice_requests_total{model=\"fashion\",outcome=\"ok\"} 7\n"),
            std::string::npos);
  EXPECT_NE(text.find("sluice_queue_requests{model=\"fashion\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_instances{model=\"fashion\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_batch_size_bucket{model=\"fashion\",le=\"2\"} 2\n"),
            std::string::npos);
}

TEST(RouterTest, OnlyRoutesMarkedPublicNeedNoKey) {
  Router router;
  auto ok = [](const HttpRequest&, const PathParams&, Responder respond) {
    respond(HttpResponse::Json(200, "{}"));
  };
  router.Get("/", ok);
  router.Get("/console/static/{asset}", ok);
  router.Get("/console/events", ok);
  router.Post("/console/static/{asset}", ok);
  router.SetPublic("GET", "/");
  router.SetPublic("GET", "/console/static/{asset}");
  EXPECT_TRUE(router.IsPublic("GET", "/"));
  EXPECT_TRUE(router.IsPublic("GET", "/console/static/console.js"));
  EXPECT_FALSE(router.IsPublic("POST", "/console/static/console.js"));  // Per method.
  EXPECT_FALSE(router.IsPublic("GET", "/console/events"));
  EXPECT_FALSE(router.IsPublic("GET", "/console/static/a/b"));  // No route: not public.
  EXPECT_FALSE(router.IsPublic("GET", "/v2/models/m"));
}

}  // namespace
}  // namespace sluice
