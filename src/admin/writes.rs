//! Who may use the admin endpoints that change state (`POST /json` spends quota, `POST
//! /reset` forgets counters). Off unless asked for: anyone who reaches the admin port could
//! otherwise reset any limit. A token (`--admin-token`) turns them on for callers who send it;
//! `--admin-writes on` opens them without one; `json` opens the reference's `POST /json` alone
//! (it only spends quota, as a decision does; reference mode uses it). Reads (`/metrics`,
//! `/config`, health) stay open either way.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// `--admin-writes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WritesMode {
    /// On with --admin-token (callers must send it), off without.
    Auto,
    /// On; callers must send --admin-token if one is set.
    On,
    /// Off: both answer 403.
    Off,
    /// `POST /json` open to anyone, as in the reference; `POST /reset` as `auto`.
    Json,
}

/// The admin's write policy: flags of `tollgate serve`.
#[derive(Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct AdminWrites {
    /// Whether the admin's mutating endpoints (`POST /json`, `POST /reset`) answer.
    #[arg(long = "admin-writes", env = "TOLLGATE_ADMIN_WRITES", value_enum, default_value_t = WritesMode::Auto)]
    pub mode: WritesMode,
    /// Require `Authorization: Bearer <token>` on the admin's mutating endpoints (401
    /// without it), and turn them on (--admin-writes auto); best set from a Secret through
    /// the environment variable. Empty: none.
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
            .field("mode", &self.mode)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// Why a mutating request is refused.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// 403: off for everyone.
    Off(&'static str),
    /// 401: the token is missing or wrong.
    NoToken,
}

impl AdminWrites {
    fn token(&self) -> Option<&str> {
        self.token.as_deref().filter(|token| !token.is_empty())
    }

    /// Whether a request to `path` that did (`presented`) or did not carry the token may
    /// change state.
    fn admits(&self, path: &str, presented: impl Fn(&str) -> bool) -> Result<(), Refusal> {
        let open_json = self.mode == WritesMode::Json && path == "/json";
        match (self.mode, self.token()) {
            (WritesMode::Off, _) => Err(Refusal::Off("this server runs with --admin-writes off")),
            _ if open_json => Ok(()),
            (WritesMode::On, None) => Ok(()),
            (_, Some(token)) if presented(token) => Ok(()),
            (_, Some(_)) => Err(Refusal::NoToken),
            (_, None) => Err(Refusal::Off(
                "set --admin-token (callers then send it) or --admin-writes on",
            )),
        }
    }
}

/// Lets a mutating request through, or answers 403 (writes off) or 401 (no or wrong token).
pub async fn guard(
    State(writes): State<Arc<AdminWrites>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    match writes.admits(&path, |token| presents(request.headers(), token)) {
        Ok(()) => next.run(request).await,
        Err(Refusal::Off(why)) => {
            (StatusCode::FORBIDDEN, format!("disabled: {why}\n")).into_response()
        }
        Err(Refusal::NoToken) => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "unauthorized: send Authorization: Bearer <the --admin-token>\n",
        )
            .into_response(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(mode: WritesMode, token: Option<&str>) -> AdminWrites {
        AdminWrites {
            mode,
            token: token.map(str::to_owned),
        }
    }

    /// What `/json` and `/reset` get, without the token and with it.
    fn answers(writes: &AdminWrites) -> [Result<(), Refusal>; 4] {
        let with = |token: &str| token == "t";
        let without = |_: &str| false;
        [
            writes.admits("/json", without),
            writes.admits("/reset", without),
            writes.admits("/json", with),
            writes.admits("/reset", with),
        ]
    }

    #[test]
    fn off_unless_a_token_is_set_or_writes_are_turned_on() {
        let off = || {
            Err(Refusal::Off(
                "set --admin-token (callers then send it) or --admin-writes on",
            ))
        };
        assert_eq!(
            answers(&writes(WritesMode::Auto, None)),
            [off(), off(), off(), off()]
        );
        assert_eq!(
            answers(&writes(WritesMode::Auto, Some(""))),
            [off(), off(), off(), off()]
        );
        let no = || Err(Refusal::NoToken);
        assert_eq!(
            answers(&writes(WritesMode::Auto, Some("t"))),
            [no(), no(), Ok(()), Ok(())]
        );
        assert_eq!(
            answers(&writes(WritesMode::On, None)),
            [Ok(()), Ok(()), Ok(()), Ok(())]
        );
        assert_eq!(
            answers(&writes(WritesMode::On, Some("t"))),
            [no(), no(), Ok(()), Ok(())]
        );
        let down = || Err(Refusal::Off("this server runs with --admin-writes off"));
        assert_eq!(
            answers(&writes(WritesMode::Off, Some("t"))),
            [down(), down(), down(), down()]
        );
    }

    #[test]
    fn json_mode_opens_the_reference_endpoint_alone() {
        let off = || {
            Err(Refusal::Off(
                "set --admin-token (callers then send it) or --admin-writes on",
            ))
        };
        assert_eq!(
            answers(&writes(WritesMode::Json, None)),
            [Ok(()), off(), Ok(()), off()]
        );
        let no = || Err(Refusal::NoToken);
        assert_eq!(
            answers(&writes(WritesMode::Json, Some("t"))),
            [Ok(()), no(), Ok(()), Ok(())]
        );
    }
}
