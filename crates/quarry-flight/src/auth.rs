//! Bearer-token authentication: with a token configured, every call must carry
//! `authorization: Bearer <token>`, or it is refused before it reaches the service.

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// The server side: checks each call's token.
#[derive(Clone)]
pub struct TokenCheck {
    expected: Option<String>,
}

impl TokenCheck {
    /// Checks for `token`; `None` accepts every call (loopback only, see [`crate::serve`]).
    pub fn new(token: Option<String>) -> Self {
        TokenCheck { expected: token.map(|t| format!("Bearer {}", t.trim())) }
    }
}

impl Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else { return Ok(request) };
        let given = request.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        if constant_time_eq(given, expected.as_bytes()) {
            Ok(request)
        } else if given.is_empty() {
            Err(Status::unauthenticated("this storage node requires a token (quarry --token-file)"))
        } else {
            Err(Status::unauthenticated("wrong token for this storage node"))
        }
    }
}

/// The client side: adds the token to each call.
#[derive(Clone)]
pub struct TokenAttach {
    header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl TokenAttach {
    /// Attaches `token` (if any).
    pub fn new(token: Option<&str>) -> Result<Self, String> {
        let header = token
            .map(|t| format!("Bearer {}", t.trim()).parse().map_err(|_| "the token must be printable ASCII".to_string()))
            .transpose()?;
        Ok(TokenAttach { header })
    }
}

impl Interceptor for TokenAttach {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request.metadata_mut().insert("authorization", header.clone());
        }
        Ok(request)
    }
}

/// Compares without an early exit, so timing does not reveal how much of a guess was right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a token file: its first line, trimmed; empty is an error.
pub fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading token file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token)
}
