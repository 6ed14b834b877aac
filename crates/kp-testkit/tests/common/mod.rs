//! Clients of the test API server.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use kp_testkit::apiserver::TestApiServer;
use kube::{Client, Config};

/// A client of `server`.
pub fn client(server: &TestApiServer) -> Client {
    Client::try_from(plain_http(Config::new(server.url().parse().unwrap()))).unwrap()
}

/// `config` for the test server's plain-HTTP URL. kube-rs builds its TLS
/// settings even for `http://`, loading the system's CA certificates when
/// no CA is given, which fails on a machine without ca-certificates; an
/// empty CA list needs none, and no TLS connection is made.
pub fn plain_http(mut config: Config) -> Config {
    config.root_cert = Some(Vec::new());
    config
}
