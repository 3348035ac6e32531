//! The region tree: named groups of nodes (`encoder/layer1`), one per
//! scope, each with its own autocast setting.

use super::Graph;
use crate::ir::DType;
use std::fmt;

/// Identifies a region (a node of the region tree).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u32);

impl RegionId {
    /// The root region, which every graph has; its path is empty.
    pub const ROOT: RegionId = RegionId(0);
}

/// A region: a named child of another region. Regions name and group
/// nodes (`encoder/layer1`); they change what a node computes only through
/// their autocast setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// The last path component (empty for the root).
    pub name: String,
    /// The enclosing region (`None` for the root).
    pub parent: Option<RegionId>,
    /// Mixed precision for the nodes in this region and the regions under
    /// it that do not say otherwise (`Context::scope_with_autocast`).
    pub autocast: RegionAutocast,
}

/// A region's own autocast setting. The root's is always `Inherit`: it
/// takes the context's (`Context::with_autocast`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RegionAutocast {
    /// As the enclosing region.
    #[default]
    Inherit,
    /// Products (matmul, conv2d, attention) in this low type (bf16 or f16).
    Low(DType),
    /// No autocast: the region computes as recorded.
    Off,
}

impl fmt::Display for RegionAutocast {
    /// `bf16`, `f16`, `off` (`inherit` for the default).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionAutocast::Inherit => f.write_str("inherit"),
            RegionAutocast::Low(d) => write!(f, "{d}"),
            RegionAutocast::Off => f.write_str("off"),
        }
    }
}

impl Graph {
    /// The region tree, indexed by `RegionId`.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The child of `parent` called `name`, created if missing.
    pub fn region(&mut self, parent: RegionId, name: &str) -> RegionId {
        if let Some(child) = self.child_region(parent, name) {
            return child;
        }
        self.regions.push(Region {
            name: name.to_string(),
            parent: Some(parent),
            autocast: RegionAutocast::Inherit,
        });
        RegionId(self.regions.len() as u32 - 1)
    }

    /// The region with this `/`-separated path, created if missing
    /// (`""` is the root).
    pub fn region_path(&mut self, path: &str) -> RegionId {
        path.split('/').filter(|p| !p.is_empty()).fold(RegionId::ROOT, |r, name| self.region(r, name))
    }

    /// The region with this `/`-separated path, if the graph has it.
    pub fn find_region(&self, path: &str) -> Option<RegionId> {
        path.split('/')
            .filter(|p| !p.is_empty())
            .try_fold(RegionId::ROOT, |r, name| self.child_region(r, name))
    }

    /// Whether region `id` is `ancestor` or lies inside it.
    pub fn within(&self, id: RegionId, ancestor: RegionId) -> bool {
        let mut cur = Some(id);
        while let Some(r) = cur {
            if r == ancestor {
                return true;
            }
            cur = self.regions.get(r.0 as usize).and_then(|r| r.parent);
        }
        false
    }

    /// The child of `parent` called `name`, if the graph has it.
    fn child_region(&self, parent: RegionId, name: &str) -> Option<RegionId> {
        self.regions
            .iter()
            .position(|r| r.parent == Some(parent) && r.name == name)
            .map(|i| RegionId(i as u32))
    }

    /// Sets a region's own autocast setting (the root's stays `Inherit`).
    pub fn set_region_autocast(&mut self, id: RegionId, autocast: RegionAutocast) {
        if id != RegionId::ROOT {
            if let Some(r) = self.regions.get_mut(id.0 as usize) {
                r.autocast = autocast;
            }
        }
    }

    /// The `/`-separated path of a region (`""` for the root).
    pub fn region_name(&self, id: RegionId) -> String {
        let mut parts = Vec::new();
        let mut cur = Some(id);
        while let Some(r) = cur {
            let region = &self.regions[r.0 as usize];
            if !region.name.is_empty() {
                parts.push(region.name.as_str());
            }
            cur = region.parent;
        }
        parts.reverse();
        parts.join("/")
    }
}
