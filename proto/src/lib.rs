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
