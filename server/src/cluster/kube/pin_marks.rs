//! How long a pin's owner has been gone, measured by the apiserver's clock: the first look
//! that finds it gone writes an annotation on the pin (field manager [`MARK_MANAGER`]); each
//! later one writes another (field manager [`CHECK_MANAGER`]), and the time since is the
//! difference of the times the apiserver stamped on the two writes (`metadata.managedFields`),
//! as release-node measures a node's absence. A write of the pin by a node (a hold taken, let
//! go) drops the annotations: the count starts again.

use super::lease::written_by;
use super::{api_code, KubeStore};
use crate::cluster::pin::{address_name, PinRead};
use crate::cluster::vocab::ClusterError;

const MARK: &str = "ipool.io/owner-gone";
const CHECKED: &str = "ipool.io/owner-gone-checked";
/// The field manager of the first write that finds the owner gone.
const MARK_MANAGER: &str = "ipool-pin-owner-gone";
/// The field manager of the later ones.
const CHECK_MANAGER: &str = "ipool-pin-owner-checked";

impl KubeStore {
    /// See [`crate::cluster::datastore::PinStore::owner_gone_for`].
    pub(super) async fn mark_gone(&self, read: &PinRead) -> Result<(i64, PinRead), ClusterError> {
        let name = address_name(&read.pin.address);
        self.token().await;
        let Some(mut obj) = self.pins.get_opt(&name).await? else {
            return Ok((0, read.clone()));
        };
        if obj.metadata.resource_version.as_deref() != Some(read.version.as_str()) {
            // Changed since it was read: looked at again next time.
            return Ok((0, read.clone()));
        }
        let notes = obj
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        let marked = notes.contains_key(MARK);
        let manager = match marked {
            // A value of its own each time: a write that changes nothing is no write.
            true => {
                notes.insert(CHECKED.into(), crate::cluster::vocab::now_ms().to_string());
                CHECK_MANAGER
            }
            false => {
                notes.insert(MARK.into(), "true".into());
                MARK_MANAGER
            }
        };
        let params = kube::api::PostParams {
            dry_run: false,
            field_manager: Some(manager.into()),
        };
        self.token().await;
        let written = match self.pins.replace(&name, &params, &obj).await {
            Ok(w) => w,
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => return Ok((0, read.clone())),
            Err(e) => return Err(e.into()),
        };
        let now = PinRead {
            pin: read.pin.clone(),
            version: written
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
        };
        if !marked {
            return Ok((0, now));
        }
        let (Some(then), Some(checked)) = (
            written_by(&written.metadata, MARK_MANAGER),
            written_by(&written.metadata, CHECK_MANAGER),
        ) else {
            return Err(ClusterError::Malformed {
                what: "pin",
                key: format!("ippins/{name}"),
                why: "the apiserver keeps no write times for it (metadata.managedFields): how long its owner has been gone cannot be measured".into(),
            });
        };
        Ok(((checked - then).max(0), now))
    }

    /// See [`crate::cluster::datastore::PinStore::owner_back`].
    pub(super) async fn unmark_gone(&self, read: &PinRead) -> Result<(), ClusterError> {
        let name = address_name(&read.pin.address);
        self.token().await;
        let Some(mut obj) = self.pins.get_opt(&name).await? else {
            return Ok(());
        };
        let Some(notes) = obj.metadata.annotations.as_mut() else {
            return Ok(());
        };
        if notes.remove(MARK).is_none() {
            return Ok(());
        }
        notes.remove(CHECKED);
        self.token().await;
        match self.pins.replace(&name, &self.post(), &obj).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
