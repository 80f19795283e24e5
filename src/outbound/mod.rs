//! Outbound HTTP: everything between a delivery worker's request and the receiver's answer.
//!
//! - [`transport`]: the seam a worker sends through; [`client`] is the real one, a pooled
//!   hyper-util client.
//! - [`resolver`]: the DNS seam, and [`egress`]: which addresses courier may connect to (pure).
//! - [`proxy`]: each connection's route, direct or through `egress.proxy`; [`tls`]: TLS toward
//!   receivers; [`conn_cap`]: the cap on idle pooled connections.
//! - [`trace`]: W3C Trace Context carried through to the receiver.

/// `hyper::rt::Write` for a connection wrapper whose field `io` does the writing: every write
/// first asks `$refuse` (given the wrapper) for an error to fail with instead; the rest
/// passes through. Used where `Pin`, `Context`, `Poll`, `io` and `Write` are in scope.
macro_rules! write_through {
    ([$($g:tt)*] $t:ty, $refuse:expr) => {
        impl<$($g)*> Write for $t {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                if let Some(e) = $refuse(&*self) {
                    return Poll::Ready(Err(e));
                }
                Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().io).poll_flush(cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                if let Some(e) = $refuse(&*self) {
                    return Poll::Ready(Err(e));
                }
                Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
            }
        }
    };
}

pub mod client;
pub mod conn_cap;
pub mod egress;
pub mod proxy;
pub mod resolver;
pub mod tls;
pub mod trace;
pub mod transport;
