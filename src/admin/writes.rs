//! Who may use the admin endpoints that change state (`POST /json` spends quota, `POST
//! /reset` forgets counters): anyone who reaches the port (the reference's behaviour and the
//! default), only callers with the bearer token `--admin-token`, or nobody
//! (`--admin-writes off`). Reads (`/metrics`, `/config`, health) stay open either way.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The admin's write policy: flags of `tollgate serve`.
#[derive(Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct AdminWrites {
    /// Whether the admin's mutating endpoints (`POST /json`, `POST /reset`) answer: `on`, or
    /// `off` (403).
    #[arg(long = "admin-writes", env = "TOLLGATE_ADMIN_WRITES", default_value = "on", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// Require `Authorization: Bearer <token>` on the admin's mutating endpoints (401
    /// without it); best set from a Secret through the environment variable. Empty: none.
    #[arg(
        long = "admin-token",
        env = "TOLLGATE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl Default for AdminWrites {
    fn default() -> Self {
        crate::options::defaults()
    }
}

impl std::fmt::Debug for AdminWrites {
    // The token never appears in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminWrites")
            .field("enabled", &self.enabled)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// Lets a mutating request through, or answers 403 (writes off) or 401 (no or wrong token).
pub async fn guard(
    State(writes): State<Arc<AdminWrites>>,
    request: Request,
    next: Next,
) -> Response {
    if !writes.enabled {
        return (
            StatusCode::FORBIDDEN,
            "disabled: this server runs with --admin-writes off\n",
        )
            .into_response();
    }
    let refused = writes
        .token
        .as_deref()
        .filter(|token| !token.is_empty())
        .is_some_and(|token| !presents(request.headers(), token));
    if refused {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "unauthorized: send Authorization: Bearer <the --admin-token>\n",
        )
            .into_response();
    }
    next.run(request).await
}

/// Whether the request carries `Authorization: Bearer <token>`, compared in constant time.
fn presents(headers: &HeaderMap, token: &str) -> bool {
    let Some(sent) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (sent, token) = (sent.as_bytes(), token.as_bytes());
    sent.len() == token.len()
        && sent
            .iter()
            .zip(token)
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}
