//! The task store as the routers' quota ledger: where replicas on one Redis
//! share their limits (`agent_reach_pipeline`'s `QuotaLedger`; the layout is
//! the store's `quota` module).

use std::sync::Arc;
use std::time::Duration;

use agent_reach_pipeline::{Answered, Demand, Exchanged, QuotaLedger, Reported};
use agent_reach_task_store::QuotaAsk;
use futures::future::BoxFuture;

use crate::TaskService;

/// The slow path's store, exchanging quota shares.
pub(crate) struct StoreLedger(pub(crate) Arc<TaskService>);

impl QuotaLedger for StoreLedger {
    fn exchange<'a>(
        &'a self,
        router: &'a str,
        demands: &'a [Demand],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Exchanged, String>> {
        Box::pin(async move {
            let asks: Vec<QuotaAsk> = demands
                .iter()
                .map(|demand| QuotaAsk {
                    name: demand.key.clone(),
                    rate: demand.rate,
                    wanted: demand.places,
                    limit: demand.limit,
                    target: demand.target,
                    holding: demand.holding,
                })
                .collect();
            let answer = self
                .0
                .store
                .exchange_quotas(router, &asks, ttl)
                .await
                .map_err(|error| error.to_string())?;
            Ok(Exchanged {
                routers: answer.routers,
                limits: answer
                    .limits
                    .into_iter()
                    .map(|limit| Answered {
                        granted: limit.granted,
                        reports: limit
                            .reports
                            .into_iter()
                            .map(|report| Reported {
                                router: report.router,
                                rate: report.rate,
                                places: report.wanted,
                            })
                            .collect(),
                    })
                    .collect(),
            })
        })
    }
}
