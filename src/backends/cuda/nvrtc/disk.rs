//! The kernel cache's files on disk (see the parent module's docs): where
//! the folder is, and reads and writes that no reader ever sees half of.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The disk cache folder the environment asks for (see the module docs).
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var("KILN_CACHE_DIR") {
        Ok(v) if v == "off" || v == "0" => None,
        Ok(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("kiln").join("kernels"))
        }
    }
}

/// The file name of a key: FNV-1a of its bytes (a collision is a miss,
/// since the full key is stored beside the CUBIN).
pub(super) fn hash_of(key: &str) -> String {
    format!("{:016x}", fnv1a(key.as_bytes()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The cached CUBIN of `key`, if the folder has it under `hash`.
pub(super) fn read_disk(dir: Option<&Path>, hash: &str, key: &str) -> Option<Vec<u8>> {
    let dir = dir?;
    let stored = std::fs::read_to_string(dir.join(format!("{hash}.key"))).ok()?;
    if stored != key {
        return None;
    }
    std::fs::read(dir.join(format!("{hash}.cubin"))).ok().filter(|c| !c.is_empty())
}

/// Best effort: a cache that cannot be written only costs compiles.
pub(super) fn write_disk(dir: Option<&Path>, hash: &str, key: &str, cubin: &[u8]) {
    let Some(dir) = dir else { return };
    if std::fs::create_dir_all(dir).is_err() {
        tracing::warn!(dir = %dir.display(), "cannot create the kernel cache folder; kernels are not cached on disk");
        return;
    }
    // A name no other write uses, in this process or another.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let write = |ext: &str, bytes: &[u8]| -> std::io::Result<()> {
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{hash}.{ext}.{}.{n}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(format!("{hash}.{ext}"))).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    };
    // The cubin first: a key without its cubin is a miss, never a wrong load.
    if write("cubin", cubin).and_then(|()| write("key", key.as_bytes())).is_err() {
        tracing::warn!(dir = %dir.display(), "cannot write to the kernel cache folder");
    }
}

#[cfg(test)]
mod tests {
    use super::{read_disk, write_disk};

    /// Eight threads of one process write the same kernel with different
    /// bytes at once (each its own length and fill), while others read:
    /// every read finds a whole file, one writer's, or nothing.
    #[test]
    fn concurrent_writes_of_one_kernel_never_publish_half_a_file() {
        let dir = std::env::temp_dir().join(format!("kiln-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let key = "kiln kernel test\nsame key";
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let dir = &dir;
                s.spawn(move || {
                    for _ in 0..20 {
                        let cubin = vec![t + 1; 200_000 + t as usize * 1000];
                        write_disk(Some(dir), "00000000000000aa", key, &cubin);
                        if let Some(got) = read_disk(Some(dir), "00000000000000aa", key) {
                            let fill = got[0];
                            assert!(
                                got.len() == 200_000 + (fill as usize - 1) * 1000
                                    && got.iter().all(|&b| b == fill),
                                "a torn cache file: {} bytes starting {fill}",
                                got.len()
                            );
                        }
                    }
                });
            }
        });
        assert!(read_disk(Some(&dir), "00000000000000aa", key).is_some());
        let left: Vec<_> =
            std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "temporary files left behind: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
