//! client-go's request metrics, fed by the API client's
//! [`ObserveLayer`](kp_source::api::ObserveLayer):
//! `rest_client_requests_total{code,method,host}` and
//! `rest_client_request_duration_seconds{verb,host}`, with client-go's
//! names, labels and buckets, which the kubernetes-mixin dashboards query.

use kp_source::api::{RequestObserver, RequestOutcome};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// client-go's buckets for `rest_client_request_duration_seconds`.
const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The code label of a request that got no response, as client-go writes it.
const NO_RESPONSE: &str = "<error>";

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The two families, shared with the registry.
#[derive(Clone)]
pub(super) struct RestClientMetrics {
    requests: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
}

impl RestClientMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
        };
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            metrics.requests.clone(),
        );
        registry.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            metrics.duration.clone(),
        );
        metrics
    }
}

impl RequestObserver for RestClientMetrics {
    fn observe(&self, outcome: &RequestOutcome<'_>) {
        let code = outcome
            .code
            .map_or_else(|| NO_RESPONSE.to_owned(), |code| code.to_string());
        self.requests
            .get_or_create(&vec![
                ("code", code),
                ("method", outcome.method.to_owned()),
                ("host", outcome.host.to_owned()),
            ])
            .inc();
        self.duration
            .get_or_create(&vec![
                ("verb", outcome.method.to_owned()),
                ("host", outcome.host.to_owned()),
            ])
            .observe(outcome.duration.as_secs_f64());
    }
}
