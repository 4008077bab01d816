//! The fuzz targets' way into the edge (`fuzz/`, feature `fuzzing`, off in
//! every service build): the front door's own connection loop on any stream,
//! so a target feeds it bytes without a socket. Not an API.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::front::{Door, HotRoutes};

/// Serves `stream` as one accepted connection of `door` (its hot routes, the
/// hand-over to hyper, keep-alive and pipelining), until the peer is done.
pub async fn serve_connection<H, S>(door: Door<H>, stream: S)
where
    H: HotRoutes,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    crate::front::serve_connection(door, stream).await;
}
