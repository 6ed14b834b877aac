//! Building the API client: where the connection settings come from
//! (`--kubeconfig`, `KUBECONFIG`, the in-cluster service account, with
//! `--master` overriding the server URL) and the client-side rate limit of
//! `clientConnection.qps` / `burst`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use super::ApiError;

/// Where the client's settings come from, in upstream's order of
/// preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// An explicit kubeconfig file (`--kubeconfig`,
    /// `clientConnection.kubeconfig`).
    File(PathBuf),
    /// The kubeconfig file(s) named by the `KUBECONFIG` environment variable.
    KubeconfigEnv,
    /// Only a server URL (`--master`), without credentials.
    MasterOnly(String),
    /// The pod's service account (`KUBERNETES_SERVICE_HOST`/`_PORT` and
    /// `/var/run/secrets/kubernetes.io/serviceaccount`).
    InCluster,
}

/// A token bucket: `burst` requests at once, refilled at `qps` per second,
/// like client-go's default rate limiter.
#[derive(Debug, Clone, Copy)]
struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    refilled_at: Instant,
}

/// A [`Layer`] that delays requests beyond the bucket's rate.
#[derive(Debug, Clone, Copy)]
pub struct RateLimitLayer {
    qps: f32,
    burst: u32,
}

/// The service of [`RateLimitLayer`]: it is not ready while the bucket is
/// empty, so the client's request buffer holds requests back.
pub struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    /// A token is taken and waits for the next `call`.
    reserved: bool,
    wait: Option<Pin<Box<Sleep>>>,
}

/// One finished API request, as client-go's request metrics see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestOutcome<'a> {
    /// The HTTP method, e.g. `GET`.
    pub method: &'a str,
    /// The API server's `host:port`.
    pub host: &'a str,
    /// The response's status code; `None` when no response came (a
    /// connection error, a timeout).
    pub code: Option<u16>,
    /// From sending the request to the response's headers (a watch counts
    /// until its stream starts, as client-go's round tripper measures it).
    pub duration: Duration,
}

/// Told of every API request the client makes
/// (`rest_client_requests_total`, `rest_client_request_duration_seconds`).
pub trait RequestObserver: Send + Sync {
    /// Records one finished request.
    fn observe(&self, outcome: &RequestOutcome<'_>);
}

/// A [`Layer`] that tells a [`RequestObserver`] of each request.
#[derive(Clone)]
pub struct ObserveLayer {
    host: Arc<str>,
    observer: Arc<dyn RequestObserver>,
}

/// The service of [`ObserveLayer`].
#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    host: Arc<str>,
    observer: Arc<dyn RequestObserver>,
}

/// Chooses where the client's settings come from: an explicit kubeconfig
/// first, then `KUBECONFIG` (`kubeconfig_env`), then a bare `--master`,
/// else the in-cluster service account.
pub fn config_origin(
    kubeconfig: Option<&Path>,
    kubeconfig_env: Option<&str>,
    master: Option<&str>,
) -> ConfigOrigin {
    if let Some(path) = kubeconfig.filter(|path| !path.as_os_str().is_empty()) {
        return ConfigOrigin::File(path.to_path_buf());
    }
    if kubeconfig_env.is_some_and(|value| !value.is_empty()) {
        return ConfigOrigin::KubeconfigEnv;
    }
    match master.filter(|master| !master.is_empty()) {
        Some(master) => ConfigOrigin::MasterOnly(master.to_owned()),
        None => ConfigOrigin::InCluster,
    }
}

/// Builds the API client kube-proxy uses: settings from `kubeconfig`, else
/// `KUBECONFIG`, else the in-cluster service account, with `master`
/// replacing the server URL when given; every request passes a token bucket
/// of `qps` requests per second and `burst` at once (a `qps` of zero or
/// less disables the limit). The client speaks JSON: kube-rs has no
/// protobuf support.
pub async fn client_from(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
    qps: f32,
    burst: u32,
) -> Result<Client, ApiError> {
    observed_client_from(kubeconfig, master, qps, burst, None).await
}

/// [`client_from`], with every request told to `observer` when given.
pub async fn observed_client_from(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
    qps: f32,
    burst: u32,
    observer: Option<Arc<dyn RequestObserver>>,
) -> Result<Client, ApiError> {
    let env = std::env::var("KUBECONFIG").ok();
    let origin = config_origin(kubeconfig, env.as_deref(), master);
    tracing::info!(origin = ?origin, master = master.unwrap_or(""), "building the API client");
    let mut config = load_config(&origin).await?;
    if let Some(master) = master.filter(|master| !master.is_empty()) {
        config.cluster_url = master.parse().map_err(|source| ApiError::InvalidMaster {
            master: master.to_owned(),
            source,
        })?;
    }
    let no_ca_configured = config.root_cert.is_none() && config.root_cert_file.is_none();
    if config.cluster_url.scheme_str() == Some("http") && config.proxy_url.is_none() {
        // kube-rs builds its TLS settings even for a plain-HTTP server, and
        // without a CA of the kubeconfig's it loads the system's trust
        // store, failing where there is none (a minimal image). No TLS
        // connection is ever made here, so an empty store will do.
        config.root_cert.get_or_insert_with(Vec::new);
    }
    let host = config
        .cluster_url
        .authority()
        .map_or_else(String::new, |authority| authority.to_string());
    let builder = ClientBuilder::try_from(config).map_err(|source| match source {
        kube::Error::RustlsTls(_) if no_ca_configured => ApiError::NoTrustStore { source },
        source => ApiError::BuildClient { source },
    })?;
    // The observer sits outside the rate limit: a request's duration is
    // the server's answer, not the time it waited for a token.
    let limit = (qps > 0.0).then(|| RateLimitLayer::new(qps, burst));
    let observe = observer.map(|observer| ObserveLayer::new(&host, observer));
    let client = builder
        .with_layer(&tower::util::option_layer(limit))
        .with_layer(&tower::util::option_layer(observe))
        .build();
    Ok(client)
}

async fn load_config(origin: &ConfigOrigin) -> Result<Config, ApiError> {
    let options = KubeConfigOptions::default();
    match origin {
        ConfigOrigin::File(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| ApiError::ReadKubeconfig {
                    path: path.clone(),
                    source,
                })?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|source| ApiError::ReadKubeconfig {
                    path: path.clone(),
                    source,
                })
        }
        ConfigOrigin::KubeconfigEnv => Config::from_kubeconfig(&options)
            .await
            .map_err(|source| ApiError::KubeconfigEnv { source }),
        ConfigOrigin::MasterOnly(master) => {
            let url = master.parse().map_err(|source| ApiError::InvalidMaster {
                master: master.clone(),
                source,
            })?;
            Ok(Config::new(url))
        }
        ConfigOrigin::InCluster => {
            Config::incluster().map_err(|source| ApiError::InCluster { source })
        }
    }
}

impl TokenBucket {
    fn new(qps: f32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            refilled_at: now,
        }
    }

    /// Takes a token if one is there; otherwise says how long until one is.
    fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.refilled_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

impl RateLimitLayer {
    /// A limit of `qps` requests per second, `burst` at once (at least one).
    pub fn new(qps: f32, burst: u32) -> Self {
        Self { qps, burst }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: TokenBucket::new(self.qps, self.burst, Instant::now()),
            reserved: false,
            wait: None,
        }
    }
}

impl<S, Request> Service<Request> for RateLimited<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.reserved {
            if let Some(wait) = self.wait.as_mut() {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
            }
            match self.bucket.try_take(Instant::now()) {
                Ok(()) => self.reserved = true,
                Err(delay) => {
                    tracing::debug!(
                        delay_ms = delay.as_millis(),
                        "API request delayed by the client rate limit"
                    );
                    self.wait = Some(Box::pin(tokio::time::sleep(delay)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.reserved = false;
        self.inner.call(request)
    }
}

impl ObserveLayer {
    /// Requests to `host` (`host:port`), told to `observer`.
    pub fn new(host: &str, observer: Arc<dyn RequestObserver>) -> Self {
        Self {
            host: host.into(),
            observer,
        }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observed {
            inner,
            host: Arc::clone(&self.host),
            observer: Arc::clone(&self.observer),
        }
    }
}

impl<S, B, R> Service<http::Request<B>> for Observed<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().clone();
        let host = Arc::clone(&self.host);
        let observer = Arc::clone(&self.observer);
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            observer.observe(&RequestOutcome {
                method: method.as_str(),
                host: &host,
                code: result.as_ref().ok().map(|r| r.status().as_u16()),
                duration: started.elapsed(),
            });
            result
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn an_explicit_kubeconfig_wins_over_the_environment_and_master() {
        let origin = config_origin(
            Some(Path::new("/etc/kube-proxy/kubeconfig")),
            Some("/root/.kube/config"),
            Some("https://10.0.0.1:6443"),
        );
        assert_eq!(
            origin,
            ConfigOrigin::File("/etc/kube-proxy/kubeconfig".into())
        );
    }

    #[test]
    fn without_a_kubeconfig_the_environment_then_master_then_the_service_account() {
        assert_eq!(
            config_origin(None, Some("/k"), Some("http://m")),
            ConfigOrigin::KubeconfigEnv
        );
        assert_eq!(
            config_origin(None, Some(""), Some("http://m")),
            ConfigOrigin::MasterOnly("http://m".into())
        );
        assert_eq!(
            config_origin(Some(Path::new("")), None, None),
            ConfigOrigin::InCluster
        );
    }

    #[test]
    fn the_bucket_allows_a_burst_then_refills_at_qps() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(5.0, 2, start);
        assert!(bucket.try_take(start).is_ok());
        assert!(bucket.try_take(start).is_ok());
        let wait = bucket.try_take(start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(200));
        assert!(bucket.try_take(start + Duration::from_millis(200)).is_ok());
        assert!(bucket.try_take(start + Duration::from_millis(200)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_tokens() {
        use tower::ServiceExt;

        let service = tower::service_fn(|request: u32| async move { Ok::<_, ()>(request) });
        let mut limited = RateLimitLayer::new(10.0, 1).layer(service);
        let start = Instant::now();
        assert_eq!(limited.ready().await.unwrap().call(1).await, Ok(1));
        assert_eq!(limited.ready().await.unwrap().call(2).await, Ok(2));
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    }
}
