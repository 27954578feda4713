//! The hardware backend: NVIDIA's management library (NVML) through
//! `nvml-wrapper`, which loads `libnvidia-ml.so.1` when asked, not at link
//! time. The same binary therefore starts on machines without a driver, and
//! there [`nvml`] returns [`Error::Backend`] (the sidecar reports
//! `GpuVisible=False` with that message) instead of readings full of zeros.
//!
//! What "used" means: NVML's memory info v2 splits the framebuffer into
//! `used + reserved + free = total`, where `reserved` is the driver's own,
//! fixed share. Readings report `used` as NVML (and `nvidia-smi`) do, and
//! `total - reserved` as the total, so `total - used` is exactly what an
//! allocation can still get: OOM is when used reaches total.
//!
//! nvml-wrapper 0.13 reads memory only through `nvmlDeviceGetMemoryInfo_v2`
//! (drivers R510 and newer). The v1 call is not reachable without `unsafe`,
//! which this crate forbids; older drivers get an error that says so.

use super::{Error, GpuInfo, GpuReading, Sampler};
use memprof_api::DataSource;
use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::MemoryInfo;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsStr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BACKEND: &str = "nvml";

/// Library names tried in order: the driver's soname (what the NVIDIA
/// container toolkit mounts), then the development symlink.
const LIB_NAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// NVML refreshes utilization every 1/6 s to 1 s depending on the product;
/// reading it more often returns the same number for an extra driver call.
const UTILIZATION_EVERY: Duration = Duration::from_secs(1);
/// The PCIe receive throughput is read with it, of at most this many GPUs
/// each time, in turn: that call samples the link for 20 ms (21 ms
/// measured on an H200) and the sidecar's one thread waits for it, so an
/// eight-GPU sidecar reads each GPU's every 4 s (42 ms a second) instead
/// of blocking 170 ms each second. A reading holds until the next.
const PCIE_READS_PER_REFRESH: usize = 2;

/// The process-wide NVML handle. `Device<'nvml>` borrows the `Nvml` it came
/// from, so keeping devices in a sampler needs an `Nvml` that outlives it:
/// a static initialised once is that, without leaking per call or a
/// self-referential struct. NVML is reference-counted by the driver and meant
/// to stay initialised for the life of a monitoring process, so never calling
/// `nvmlShutdown` costs nothing.
static NVML: OnceLock<Nvml> = OnceLock::new();

/// The process-wide NVML handle, initialised on first use. Fails with a typed
/// error (never a panic) when the library or the driver is missing; a later
/// call tries again.
pub fn nvml() -> Result<&'static Nvml, Error> {
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let mut first = None;
    for name in LIB_NAMES {
        match Nvml::builder().lib_path(OsStr::new(name)).init() {
            Ok(n) => return Ok(NVML.get_or_init(|| n)),
            // Only a missing library is worth another name; a driver error is final.
            // The error worth showing is the soname's, the one the toolkit mounts.
            Err(NvmlError::LibloadingError(e)) => {
                first.get_or_insert(NvmlError::LibloadingError(e));
            }
            Err(e) => return Err(init_error(e)),
        }
    }
    Err(init_error(first.unwrap_or(NvmlError::Unknown)))
}

fn init_error(e: NvmlError) -> Error {
    let why = match e {
        NvmlError::LibloadingError(e) => format!(
            "cannot load libnvidia-ml.so.1 ({e}): no NVIDIA driver is visible to this container; \
             run it with the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES=all and \
             NVIDIA_DRIVER_CAPABILITIES including utility), or rely on the in-process agent"
        ),
        NvmlError::DriverNotLoaded => {
            "the NVIDIA kernel driver is not loaded on this node: check `nvidia-smi` on the host"
                .into()
        }
        NvmlError::NoPermission => {
            "NVML has no permission to talk to the driver: the container needs access to \
             /dev/nvidiactl and the GPUs' device nodes"
                .into()
        }
        other => format!("NVML initialisation failed: {other}"),
    };
    Error::Backend {
        backend: BACKEND,
        why,
    }
}

fn call_error(what: &str, index: u32, e: NvmlError) -> Error {
    let why = match e {
        NvmlError::FailedToLoadSymbol(s) => format!(
            "{what} of GPU {index}: this driver's NVML lacks {s}; memprof needs driver R510 or newer"
        ),
        NvmlError::GpuLost => format!(
            "{what} of GPU {index}: the GPU has fallen off the bus (GpuLost); the node needs attention"
        ),
        other => format!("{what} of GPU {index}: {other}"),
    };
    Error::Backend {
        backend: BACKEND,
        why,
    }
}

/// A GPU as NVML enumerates it: what discovery matches against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvmlGpu {
    /// NVML index on the node.
    pub index: u32,
    /// GPU UUID (`GPU-…`).
    pub uuid: String,
    /// MIG mode is on: the GPU is split into instances (other tenants'
    /// among them), and its memory as NVML reports it is theirs together.
    pub mig: bool,
}

/// `nvmlDeviceGetMigMode`'s value for "enabled" (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLED: u32 = 1;

/// Whether MIG mode is on. GPUs without MIG answer `NotSupported`: off.
fn mig_enabled(d: &Device<'_>) -> bool {
    d.mig_mode().is_ok_and(|m| m.current == MIG_ENABLED)
}

/// Every physical GPU NVML sees, in index order (MIG instances are not
/// enumerated by index; their parents say `mig`).
pub fn list_gpus() -> Result<Vec<NvmlGpu>, Error> {
    let nvml = nvml()?;
    let count = nvml
        .device_count()
        .map_err(|e| call_error("device count", 0, e))?;
    (0..count)
        .map(|index| {
            let d = nvml
                .device_by_index(index)
                .map_err(|e| call_error("device handle", index, e))?;
            let uuid = d.uuid().map_err(|e| call_error("UUID", index, e))?;
            Ok(NvmlGpu {
                index,
                uuid,
                mig: mig_enabled(&d),
            })
        })
        .collect()
}

/// The memory of one GPU as NVML reports it, for logs and probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryDetail {
    /// Framebuffer size, bytes.
    pub total: u64,
    /// The driver's fixed reservation, bytes.
    pub reserved: u64,
    /// In use by contexts and allocations, bytes.
    pub used: u64,
    /// Free, bytes.
    pub free: u64,
}

impl From<&MemoryInfo> for MemoryDetail {
    fn from(m: &MemoryInfo) -> Self {
        MemoryDetail {
            total: m.total,
            reserved: m.reserved,
            used: m.used,
            free: m.free,
        }
    }
}

impl MemoryDetail {
    /// What allocations can use at most: the framebuffer less the driver's reservation.
    pub fn usable(&self) -> u64 {
        self.total.saturating_sub(self.reserved).max(1)
    }

    /// As a reading: used against the usable total (see the module doc),
    /// with what the GPU was doing.
    pub fn reading(&self, activity: Activity) -> GpuReading {
        let total = self.usable();
        GpuReading {
            used_bytes: self.used.min(total),
            total_bytes: total,
            utilization_percent: activity.utilization_percent,
            received_bytes_per_second: activity.received_bytes_per_second,
        }
    }
}

/// What a GPU was doing at its last read: computing, and receiving bytes
/// from the host. Decoration: a GPU that cannot say still has memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Utilization, percent.
    pub utilization_percent: Option<u32>,
    /// PCIe receive throughput, bytes per second.
    pub received_bytes_per_second: Option<u64>,
}

impl Activity {
    /// Utilization now, and the PCIe throughput when `pcie` (else the
    /// previous reading's).
    fn read(d: &Device<'static>, previous: Activity, pcie: bool) -> Self {
        Activity {
            utilization_percent: d.utilization_rates().ok().map(|u| u.gpu.min(100)),
            // NVML says KB/s.
            received_bytes_per_second: if pcie {
                d.pcie_throughput(PcieUtilCounter::Receive)
                    .ok()
                    .map(|kb| u64::from(kb) * 1000)
            } else {
                previous.received_bytes_per_second
            },
        }
    }
}

/// A process holding memory on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    /// NVML index of the GPU.
    pub gpu_index: u32,
    /// Process ID (in the host's PID namespace unless the container shares it).
    pub pid: u32,
    /// Memory the process holds, bytes; `None` where the driver does not say.
    pub used_bytes: Option<u64>,
}

/// Samples the memory of chosen GPUs through NVML.
pub struct NvmlSampler {
    devices: Vec<Device<'static>>,
    gpus: Vec<GpuInfo>,
    activity: Vec<Activity>,
    /// The GPU whose PCIe throughput is read first at the next refresh.
    pcie_next: usize,
    utilization_read: Option<Instant>,
    utilization_every: Duration,
}

impl std::fmt::Debug for NvmlSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSampler")
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

impl NvmlSampler {
    /// A sampler of the GPUs with these NVML indices, in this order. Device
    /// handles, names and UUIDs are fetched once here, so [`Sampler::sample`]
    /// makes one driver call per GPU (three when utilization is due: it and
    /// the PCIe throughput).
    pub fn new(indices: &[u32]) -> Result<Self, Error> {
        let nvml = nvml()?;
        let mut devices = Vec::with_capacity(indices.len());
        let mut gpus = Vec::with_capacity(indices.len());
        for &index in indices {
            let d = nvml
                .device_by_index(index)
                .map_err(|e| call_error("device handle", index, e))?;
            let uuid = d.uuid().map_err(|e| call_error("UUID", index, e))?;
            let model = d.name().unwrap_or_else(|_| "NVIDIA GPU".into());
            let mem = d
                .memory_info()
                .map_err(|e| call_error("memory info", index, e))?;
            gpus.push(GpuInfo {
                index,
                uuid,
                model,
                total_bytes: MemoryDetail::from(&mem).usable(),
            });
            devices.push(d);
        }
        Ok(NvmlSampler {
            activity: vec![Activity::default(); devices.len()],
            pcie_next: 0,
            devices,
            gpus,
            utilization_read: None,
            utilization_every: UTILIZATION_EVERY,
        })
    }

    /// A sampler of every GPU NVML sees.
    pub fn all() -> Result<Self, Error> {
        let indices: Vec<u32> = list_gpus()?.iter().map(|g| g.index).collect();
        Self::new(&indices)
    }

    /// Reads utilization at most this often (default 1 s); `Duration::ZERO`
    /// reads it at every sample.
    pub fn with_utilization_every(mut self, every: Duration) -> Self {
        self.utilization_every = every;
        self
    }

    /// The full memory picture of every sampled GPU, in [`Sampler::gpus`] order.
    pub fn memory_detail(&self) -> Result<Vec<MemoryDetail>, Error> {
        self.devices
            .iter()
            .zip(&self.gpus)
            .map(|(d, g)| {
                d.memory_info()
                    .map(|m| MemoryDetail::from(&m))
                    .map_err(|e| call_error("memory info", g.index, e))
            })
            .collect()
    }

    /// The compute processes on the sampled GPUs with the memory each holds
    /// (for the standalone report and logs; a few driver calls per GPU, so not
    /// for every sample). A GPU whose list cannot be read is skipped.
    pub fn processes(&self) -> Vec<GpuProcess> {
        let mut out = Vec::new();
        for (d, g) in self.devices.iter().zip(&self.gpus) {
            let Ok(list) = d.running_compute_processes() else {
                continue;
            };
            out.extend(list.into_iter().map(|p| GpuProcess {
                gpu_index: g.index,
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            }));
        }
        out
    }

    fn utilization_due(&self, now: Instant) -> bool {
        self.utilization_read
            .is_none_or(|last| now.duration_since(last) >= self.utilization_every)
    }
}

impl Sampler for NvmlSampler {
    fn active_processes(&mut self) -> Option<usize> {
        Some(NvmlSampler::processes(self).len())
    }

    fn processes(&mut self) -> Option<Vec<GpuProcess>> {
        Some(NvmlSampler::processes(self))
    }

    fn source(&self) -> DataSource {
        DataSource::Nvml
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    fn sample(&mut self, _t: f64) -> Result<Vec<GpuReading>, Error> {
        let now = Instant::now();
        let refresh = self.utilization_due(now);
        if refresh {
            self.utilization_read = Some(now);
        }
        let n = self.devices.len();
        let pcie = |i: usize| pcie_turn(i, n, self.pcie_next);
        let mut out = Vec::with_capacity(n);
        for (i, d) in self.devices.iter().enumerate() {
            let index = self.gpus[i].index;
            let mem = d
                .memory_info()
                .map_err(|e| call_error("memory info", index, e))?;
            if refresh {
                self.activity[i] = Activity::read(d, self.activity[i], pcie(i));
            }
            out.push(MemoryDetail::from(&mem).reading(self.activity[i]));
        }
        if refresh {
            self.pcie_next = (self.pcie_next + PCIE_READS_PER_REFRESH) % n.max(1);
        }
        Ok(out)
    }
}

/// Whether GPU `i` of `n` has its PCIe throughput read at a refresh that
/// starts with GPU `next`: [`PCIE_READS_PER_REFRESH`] of them, in turn.
fn pcie_turn(i: usize, n: usize, next: usize) -> bool {
    (i + n - next % n.max(1)) % n.max(1) < PCIE_READS_PER_REFRESH
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each GPU's PCIe throughput is read in turn, at most two a refresh:
    /// every refresh for one or two GPUs, every fourth for eight.
    #[test]
    fn pcie_is_read_for_at_most_two_gpus_a_refresh_each_in_turn() {
        assert!(pcie_turn(0, 1, 0));
        for n in [1usize, 2, 3, 8] {
            let mut next = 0;
            let mut reads = vec![0; n];
            for _ in 0..8 {
                let turn: Vec<usize> = (0..n).filter(|&i| pcie_turn(i, n, next)).collect();
                assert!(turn.len() <= PCIE_READS_PER_REFRESH, "{n}: {turn:?}");
                turn.iter().for_each(|&i| reads[i] += 1);
                next = (next + PCIE_READS_PER_REFRESH) % n;
            }
            let fewest = *reads.iter().min().unwrap();
            assert!(
                fewest >= 8 * PCIE_READS_PER_REFRESH.min(n) / n,
                "{n}: {reads:?}"
            );
        }
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_reading_counts_against_what_allocations_can_use() {
        // An H100 80GB as driver 580 reports it (MiB figures of nvidia-smi -q).
        let m = MemoryDetail {
            total: 81_559 * (1 << 20),
            reserved: 529 * (1 << 20),
            used: 40 * GIB,
            free: 81_559 * (1 << 20) - 529 * (1 << 20) - 40 * GIB,
        };
        let r = m.reading(Activity {
            utilization_percent: Some(97),
            received_bytes_per_second: Some(5),
        });
        assert_eq!(r.used_bytes, 40 * GIB);
        assert_eq!(r.total_bytes, m.used + m.free);
        assert_eq!(r.utilization_percent, Some(97));
        assert_eq!(r.received_bytes_per_second, Some(5));
    }

    #[test]
    fn a_reading_never_exceeds_its_total_nor_divides_by_zero() {
        let m = MemoryDetail {
            total: 10,
            reserved: 20,
            used: 30,
            free: 0,
        };
        let r = m.reading(Activity::default());
        assert_eq!(r.total_bytes, 1);
        assert!(r.used_bytes <= r.total_bytes);
    }

    /// On a machine without a driver (CI), opening NVML is a typed error that
    /// says what to do; on a GPU machine it lists GPUs. Never a panic.
    #[test]
    fn opening_nvml_is_an_error_or_real_gpus() {
        match NvmlSampler::all() {
            Err(Error::Backend { backend, why }) => {
                assert_eq!(backend, "nvml");
                assert!(!why.is_empty());
            }
            Err(other) => panic!("unexpected error kind: {other}"),
            Ok(mut s) => {
                let readings = s.sample(0.0).unwrap();
                assert_eq!(readings.len(), s.gpus().len());
                for (r, g) in readings.iter().zip(s.gpus()) {
                    assert!(r.total_bytes > 0 && r.used_bytes <= r.total_bytes);
                    assert!(g.uuid.starts_with("GPU-") || g.uuid.starts_with("MIG-"));
                }
            }
        }
    }

    #[test]
    fn a_missing_library_says_how_to_fix_it() {
        let e = init_error(NvmlError::DriverNotLoaded);
        assert!(e.to_string().contains("nvidia-smi"), "{e}");
        let e = call_error(
            "memory info",
            3,
            NvmlError::FailedToLoadSymbol("nvmlDeviceGetMemoryInfo_v2".into()),
        );
        assert!(e.to_string().contains("R510"), "{e}");
        assert!(e.to_string().contains("GPU 3"), "{e}");
    }
}
