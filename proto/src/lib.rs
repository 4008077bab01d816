//! Wire types of Agent-Reach: the generated gRPC code and the serde types of the
//! HTTP/JSON API. Services convert to and from their own types at the edge.

pub mod codes;
pub mod context_http;
pub mod envelope;
pub mod http;
pub mod vocabulary;

pub use codes::RouterCode;
pub use vocabulary::{Priority, Status, UnknownStatus};

/// The registry's gRPC API (`proto/registry.proto`).
pub mod registry {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("agentreach.registry.v1");
}

/// The context service's gRPC API (`proto/context.proto`).
pub mod context {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("agentreach.context.v1");
}

/// The subset of etcd's v3 API the registry uses (`proto/etcd.proto`).
pub mod etcd {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("etcdserverpb");
}

/// A2A's gRPC binding (`proto/a2a.proto`: the A2A specification's `a2a.proto`
/// at v1.0.1, `lf.a2a.v1`, unchanged), and the `google.rpc` error model its
/// errors carry (`status.details`).
pub mod a2a {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("lf.a2a.v1");

    /// `google.rpc` messages (googleapis' `google/rpc/status.proto` and
    /// `error_details.proto`), written out: the two A2A errors use.
    pub mod rpc {
        /// `google.rpc.Status`: what `grpc-status-details-bin` carries.
        #[derive(Clone, PartialEq, ::prost::Message)]
        pub struct Status {
            #[prost(int32, tag = "1")]
            pub code: i32,
            #[prost(string, tag = "2")]
            pub message: ::prost::alloc::string::String,
            #[prost(message, repeated, tag = "3")]
            pub details: ::prost::alloc::vec::Vec<::prost_types::Any>,
        }

        /// `google.rpc.ErrorInfo`.
        #[derive(Clone, PartialEq, ::prost::Message)]
        pub struct ErrorInfo {
            #[prost(string, tag = "1")]
            pub reason: ::prost::alloc::string::String,
            #[prost(string, tag = "2")]
            pub domain: ::prost::alloc::string::String,
            #[prost(map = "string, string", tag = "3")]
            pub metadata: ::std::collections::HashMap<::prost::alloc::string::String, ::prost::alloc::string::String>,
        }

        /// `ErrorInfo`'s type URL in an `Any`.
        pub const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";
    }
}
