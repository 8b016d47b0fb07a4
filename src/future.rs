//! The future both layers return: the inner future as it is for requests a
//! layer does not apply to (no allocation), or the layer's boxed decision.

use crate::body::ResponseBody;
use http::Response;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub(crate) type BoxedAnswer<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

pin_project! {
    #[project = AnsweringProj]
    pub(crate) enum Answering<F, B, E> {
        Passthrough { #[pin] future: F },
        Decided { future: BoxedAnswer<B, E> },
    }
}

impl<F, B, E> Future for Answering<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AnsweringProj::Passthrough { future } => future
                .poll(cx)
                .map(|result| result.map(|response| response.map(ResponseBody::inner))),
            AnsweringProj::Decided { future } => future.as_mut().poll(cx),
        }
    }
}

/// Defines a layer's public response future around [`Answering`].
macro_rules! response_future {
    ($(#[$doc:meta])* $service:literal) => {
        pin_project_lite::pin_project! {
            $(#[$doc])*
            pub struct ResponseFuture<F, B, E> {
                #[pin]
                inner: crate::future::Answering<F, B, E>,
            }
        }

        impl<F, B, E> ResponseFuture<F, B, E> {
            pub(crate) fn passthrough(future: F) -> Self {
                Self {
                    inner: crate::future::Answering::Passthrough { future },
                }
            }

            pub(crate) fn decided(future: crate::future::BoxedAnswer<B, E>) -> Self {
                Self {
                    inner: crate::future::Answering::Decided { future },
                }
            }
        }

        impl<F, B, E> std::future::Future for ResponseFuture<F, B, E>
        where
            F: std::future::Future<Output = Result<http::Response<B>, E>>,
        {
            type Output = Result<http::Response<crate::body::ResponseBody<B>>, E>;

            fn poll(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Self::Output> {
                self.project().inner.poll(cx)
            }
        }

        impl<F, B, E> std::fmt::Debug for ResponseFuture<F, B, E> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(concat!($service, "::ResponseFuture"))
                    .finish_non_exhaustive()
            }
        }
    };
}

pub(crate) use response_future;
