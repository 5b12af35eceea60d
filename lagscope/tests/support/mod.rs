//! Shared by the integration tests: a server started in-process on port 0, and an API client.

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use lagscope::{Config, Server};
use serde_json::Value;

pub async fn start_server(data_dir: &Path) -> Server {
    let mut config = Config::default();
    config.server.data_dir = data_dir.to_path_buf();
    config.server.listen = "127.0.0.1:0".to_string();
    config.server.otlp_http = "127.0.0.1:0".to_string();
    config.server.otlp_grpc = "127.0.0.1:0".to_string();
    Server::start(&config).await.expect("server starts")
}

pub async fn get_json(server: &Server, path_and_query: &str) -> (u16, Value) {
    let response = reqwest::get(format!("http://{}{path_and_query}", server.api_addr)).await.expect("api reachable");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

/// Waits until the live analyzer has finished every batch committed so far.
pub async fn wait_until_analyzed(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, health) = get_json(server, "/api/v1/health").await;
        let marked = health["analysis"]["batches_marked"].as_u64().unwrap_or(u64::MAX);
        let analyzed = health["analysis"]["batches_analyzed"].as_u64().unwrap_or(0);
        if analyzed >= marked {
            return;
        }
        assert!(Instant::now() < deadline, "the live analyzer is stuck at {analyzed} of {marked} batches");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
