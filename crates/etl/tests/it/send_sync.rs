//! What the crate promises about `Send` and `Sync`, checked at compile
//! time: a pipeline is built and run inside tasks of a multi-threaded
//! runtime (`tokio::spawn(pipeline.run(token))`), so the builder, the
//! pipeline, the futures that build and run it, and what they return
//! cross threads.

use etl::{Config, MetricsHub, Pipeline, PipelineBuilder, PipelineError, Registry, Summary};
use tokio_util::sync::CancellationToken;

const _: fn() = || {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    fn send_value<T: Send>(_: &T) {}
    fn futures_are_send(config: &Config, pipeline: Pipeline) {
        send_value(&etl::pipeline_from_config(config));
        send_value(&PipelineBuilder::from_config(config));
        send_value(&pipeline.run(CancellationToken::new()));
    }
    send::<Pipeline>();
    send::<PipelineBuilder>();
    send_sync::<PipelineError>();
    send_sync::<Summary>();
    send_sync::<MetricsHub>();
    send_sync::<Config>();
    send_sync::<Registry>();
    let _ = futures_are_send;
};
