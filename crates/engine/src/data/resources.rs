//! The resources one engine (daemon or agent end) pre-allocates at start
//! (INI layer, seed 000 sec. 6.1.2): a bounded buffer pool and one thread
//! pool per role. Sessions borrow from them and give everything back.

use std::sync::Arc;
use std::time::Duration;

use ramsys_resources::{BufferPool, ThreadPool};

/// Most data streams an engine serves at once by default (issue 21). The
/// memory budget, not the threads, is what streams cost: the default
/// 256 MiB of 4 MiB buffers gives 32 streams 2 credits each, 8 MiB in
/// flight per stream, above the 4 MiB one stream holds on a long path
/// (transport::path), and 32 x 4 MiB covers 10 Gb/s x 100 ms (125 MB).
/// At 16 a 50 ms path was already at the limit (transport::grow found the
/// rate still rising there). Idle pool threads are parked.
pub const DEFAULT_MAX_STREAMS: usize = 32;

/// Sizes of what is pre-allocated.
#[derive(Debug, Clone)]
pub struct ResourceConfig {
    /// Total buffer memory, bytes (caps memory use whatever the data set).
    pub memory: usize,
    /// Size of each buffer = largest block size served.
    pub buffer_size: usize,
    pub readers: usize,
    pub writers: usize,
    /// Most data streams served at once (sender and receiver threads).
    pub max_streams: usize,
    /// CPUs for storage threads and for network threads (empty: unpinned).
    pub storage_cpus: Vec<usize>,
    pub net_cpus: Vec<usize>,
    /// NUMA node for the buffer pool (None: heap memory, OS placement).
    pub buffer_node: Option<u32>,
}

impl Default for ResourceConfig {
    fn default() -> Self {
        ResourceConfig {
            memory: 256 << 20,
            buffer_size: 4 << 20,
            readers: 4,
            writers: 4,
            max_streams: DEFAULT_MAX_STREAMS,
            storage_cpus: Vec::new(),
            net_cpus: Vec::new(),
            buffer_node: None,
        }
    }
}

/// Buffer memory bound to a NUMA node (mbind before first touch,
/// pre-faulted; seed 000 sec. 6.1.5).
pub struct NodeMemory(pub ramsys_topo::NodeRegion);

impl ramsys_resources::Memory for NodeMemory {
    fn ptr(&self) -> *mut u8 {
        self.0.as_ptr() as *mut u8
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn node(&self) -> Option<u32> {
        match self.0.binding() {
            ramsys_topo::Binding::Bound { node, .. } => Some(*node),
            _ => None,
        }
    }
}

/// Pre-allocated pools of one engine.
pub struct EngineResources {
    pub buffers: Arc<BufferPool>,
    pub readers: Arc<ThreadPool>,
    pub writers: Arc<ThreadPool>,
    pub senders: Arc<ThreadPool>,
    pub receivers: Arc<ThreadPool>,
    pub config: ResourceConfig,
    /// The node-bound region behind `buffers`, kept to verify placement.
    pub node_memory: Option<Arc<NodeMemory>>,
}

impl EngineResources {
    pub fn new(cfg: &ResourceConfig) -> anyhow::Result<Self> {
        let count = (cfg.memory / cfg.buffer_size).max(4);
        let mut node_memory = None;
        let buffers = match cfg.buffer_node {
            None => BufferPool::allocate(count, cfg.buffer_size)?,
            Some(node) => {
                let size = cfg.buffer_size.div_ceil(4096) * 4096;
                let region = ramsys_topo::NodeRegion::alloc(size * count, Some(node))?;
                let mem = Arc::new(NodeMemory(region));
                node_memory = Some(mem.clone());
                BufferPool::from_memory(mem, count, size)?
            }
        };
        Ok(EngineResources {
            buffers: Arc::new(buffers),
            readers: ThreadPool::new("reader", cfg.readers, cfg.storage_cpus.clone())?,
            writers: ThreadPool::new("writer", cfg.writers, cfg.storage_cpus.clone())?,
            senders: ThreadPool::new("sender", cfg.max_streams, cfg.net_cpus.clone())?,
            receivers: ThreadPool::new("receiver", cfg.max_streams, cfg.net_cpus.clone())?,
            config: cfg.clone(),
            node_memory,
        })
    }

    /// A session's share of buffers: between `min` and `max`, waiting up
    /// to `wait` for `min`.
    pub fn take_buffers(&self, min: usize, max: usize, wait: Duration) -> Option<BufferPool> {
        let bufs = self
            .buffers
            .take(min.min(self.buffers.count()), max, wait)?;
        BufferPool::from_bufs(bufs).ok()
    }

    /// Where the buffer pool's pages really are: (node, pages) from
    /// move_pages, or None when the pool is plain heap memory.
    pub fn verify_buffers(&self) -> Option<std::io::Result<Vec<(u32, usize)>>> {
        self.node_memory.as_ref().map(|m| m.0.verify_nodes())
    }

    /// Return a session's share (waits briefly for stragglers).
    pub fn return_buffers(&self, share: Arc<BufferPool>) {
        match Arc::try_unwrap(share) {
            Ok(p) => {
                for b in p.into_bufs(Duration::from_secs(5)) {
                    self.buffers.put(b);
                }
            }
            Err(_) => tracing::warn!("buffer share still referenced at session end; leaking it"),
        }
    }
}

/// A session's share of the engine's buffer pool, given back on every
/// exit (issue 16: one guard instead of a hand-written return per early
/// return). Every clone of [`ShareGuard::pool`] must be gone by then
/// (threads joined), or the share is leaked with a warning.
pub struct ShareGuard<'a> {
    res: &'a EngineResources,
    pool: Option<Arc<BufferPool>>,
}

impl<'a> ShareGuard<'a> {
    pub fn new(res: &'a EngineResources, share: BufferPool) -> Self {
        ShareGuard {
            res,
            pool: Some(Arc::new(share)),
        }
    }

    pub fn pool(&self) -> &Arc<BufferPool> {
        self.pool.as_ref().expect("share held until drop")
    }
}

impl Drop for ShareGuard<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.pool.take() {
            self.res.return_buffers(p);
        }
    }
}
