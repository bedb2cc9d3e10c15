//! Reading properties through the PropertyCollector, page by page.

use std::fmt::Write;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::soap::MoRef;
use crate::xml::{Element, escape};

const PAGE: usize = 500;

/// More objects than any vCenter holds (its limits are tens of thousands of VMs and hosts): an endpoint that keeps
/// handing out continuation tokens is cut off here.
pub const MAX_OBJECTS: usize = 200_000;

/// Pages of one listing, counting empty ones: a token that leads only to more tokens ends here.
pub const MAX_PAGES: usize = 2 * MAX_OBJECTS / PAGE;

/// One object and the properties it has (unset properties are absent).
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectContent {
    pub obj: MoRef,
    pub props: Vec<(String, Element)>,
}

impl ObjectContent {
    pub fn prop(&self, path: &str) -> Option<&Element> {
        self.props
            .iter()
            .find(|(name, _)| name == path)
            .map(|(_, val)| val)
    }

    pub fn text(&self, path: &str) -> Option<&str> {
        self.prop(path).map(|v| v.text.as_str())
    }

    pub fn int(&self, path: &str) -> Option<i64> {
        self.text(path).and_then(|t| t.trim().parse().ok())
    }
}

/// Properties `paths` of `objects`, all of type `type_`.
pub async fn retrieve(
    session: &Session,
    type_: &str,
    objects: &[MoRef],
    paths: &[&str],
) -> Result<Vec<ObjectContent>> {
    let mut spec = prop_set(type_, paths);
    for obj in objects {
        let _ = write!(
            spec,
            "<objectSet>{}<skip>false</skip></objectSet>",
            obj.xml("obj")
        );
    }
    retrieve_spec(session, &spec).await
}

/// Whether VM `vm`'s property `path` reads `value`: one property read, false when the property is unset.
pub async fn vm_property_is(
    session: &Session,
    vm: &MoRef,
    path: &str,
    value: &str,
) -> Result<bool> {
    let found = retrieve(session, "VirtualMachine", std::slice::from_ref(vm), &[path]).await?;
    Ok(found.first().and_then(|o| o.text(path)) == Some(value))
}

/// Properties of every object of `type_` under the root folder, through a container view.
pub async fn retrieve_all(
    session: &Session,
    type_: &str,
    paths: &[&str],
) -> Result<Vec<ObjectContent>> {
    let root = session.content().root_folder.clone();
    retrieve_under(session, &root, type_, paths).await
}

/// Properties of every object of `type_` below `container` (a folder, at any depth), through a container view.
pub async fn retrieve_under(
    session: &Session,
    container: &MoRef,
    type_: &str,
    paths: &[&str],
) -> Result<Vec<ObjectContent>> {
    let content = session.content();
    let view_manager = content
        .view_manager
        .clone()
        .ok_or_else(|| Error::InvalidResponse {
            method: "RetrieveServiceContent".into(),
            detail: "the endpoint has no ViewManager".into(),
        })?;
    let args = format!(
        "{}<type>{}</type><recursive>true</recursive>",
        container.xml("container"),
        escape(type_)
    );
    let response = session
        .call("CreateContainerView", &view_manager, &args)
        .await?;
    let view = response
        .child("returnval")
        .and_then(MoRef::from_element)
        .ok_or_else(|| Error::InvalidResponse {
            method: "CreateContainerView".into(),
            detail: "no view".into(),
        })?;
    let spec = format!(
        r#"{}<objectSet>{}<skip>true</skip><selectSet xsi:type="TraversalSpec"><name>view</name><type>ContainerView</type><path>view</path><skip>false</skip></selectSet></objectSet>"#,
        prop_set(type_, paths),
        view.xml("obj")
    );
    let result = retrieve_spec(session, &spec).await;
    if let Err(e) = session.call("DestroyView", &view, "").await {
        tracing::debug!("DestroyView {view}: {e}");
    }
    result
}

fn prop_set(type_: &str, paths: &[&str]) -> String {
    let mut out = format!("<propSet><type>{}</type>", escape(type_));
    for path in paths {
        let _ = write!(out, "<pathSet>{}</pathSet>", escape(path));
    }
    out.push_str("</propSet>");
    out
}

async fn retrieve_spec(session: &Session, spec: &str) -> Result<Vec<ObjectContent>> {
    match retrieve_pages(session, spec).await {
        // vcsim reports an expired session per property (missingSet) instead of as a SOAP fault.
        Err(NotAuthenticated) => {
            session.relogin().await?;
            retrieve_pages(session, spec)
                .await
                .map_err(|_| Error::Fault {
                    method: "RetrievePropertiesEx".into(),
                    fault: "NotAuthenticated".into(),
                    message: "the session was refused right after logging in again".into(),
                })?
        }
        Ok(result) => result,
    }
}

struct NotAuthenticated;

async fn retrieve_pages(
    session: &Session,
    spec: &str,
) -> std::result::Result<Result<Vec<ObjectContent>>, NotAuthenticated> {
    let collector = session.content().property_collector.clone();
    let args =
        format!("<specSet>{spec}</specSet><options><maxObjects>{PAGE}</maxObjects></options>");
    let mut response = match session
        .call("RetrievePropertiesEx", &collector, &args)
        .await
    {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let mut objects = Vec::new();
    let mut pages = 0;
    // No `returnval` means nothing matched.
    while let Some(result) = response.child("returnval") {
        pages += 1;
        if pages > MAX_PAGES || objects.len() > MAX_OBJECTS {
            return Ok(Err(Error::InvalidResponse {
                method: "ContinueRetrievePropertiesEx".into(),
                detail: format!(
                    "the listing did not end after {} pages and {} objects; no vCenter holds that many",
                    pages - 1,
                    objects.len()
                ),
            }));
        }
        for found in result.children_named("objects") {
            let missing_fault =
                |m: &Element| m.at(&["fault", "fault"]).and_then(|f| f.xsi_type.clone());
            if found
                .children_named("missingSet")
                .any(|m| missing_fault(m).as_deref() == Some("NotAuthenticated"))
            {
                return Err(NotAuthenticated);
            }
            objects.extend(object_content(found));
        }
        let Some(token) = result.text_at(&["token"]).map(str::to_string) else {
            break;
        };
        let args = format!("<token>{}</token>", escape(&token));
        response = match session
            .call("ContinueRetrievePropertiesEx", &collector, &args)
            .await
        {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
    }
    Ok(Ok(objects))
}

/// One object of a `RetrievePropertiesEx` page (`returnval/objects`); `None` when it names no object.
pub fn object_content(objects: &Element) -> Option<ObjectContent> {
    let obj = MoRef::from_element(objects.child("obj")?)?;
    let props = objects
        .children_named("propSet")
        .filter_map(|p| Some((p.text_at(&["name"])?.to_string(), p.child("val")?.clone())))
        .collect();
    Some(ObjectContent { obj, props })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soap::{Response, parse_response};

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/fixtures/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    #[test]
    fn a_vm_description_parses_with_vcsims_prefix() {
        let Response::Ok(response) =
            parse_response("RetrievePropertiesEx", &fixture("describe-vm-vcenter.xml")).unwrap()
        else {
            panic!("fault");
        };
        let objects: Vec<_> = response
            .child("returnval")
            .unwrap()
            .children_named("objects")
            .filter_map(object_content)
            .collect();
        assert_eq!(objects.len(), 1);
        let vm = &objects[0];
        assert_eq!(vm.text("name"), Some("DC0_H0_VM0"));
        assert_eq!(vm.text("runtime.powerState"), Some("poweredOn"));
        let devices = vm.prop("config.hardware.device").unwrap();
        assert_eq!(devices.xsi_type.as_deref(), Some("ArrayOfVirtualDevice"));
        assert!(
            devices
                .children
                .iter()
                .any(|d| d.xsi_type.as_deref() == Some("VirtualDisk"))
        );
    }

    #[test]
    fn vcsims_per_property_not_authenticated_is_seen() {
        let Response::Ok(response) = parse_response(
            "RetrievePropertiesEx",
            &fixture("missing-set-not-authenticated-vcsim.xml"),
        )
        .unwrap() else {
            panic!("fault");
        };
        let missing = response.find("missingSet").unwrap();
        assert_eq!(
            missing.at(&["fault", "fault"]).unwrap().xsi_type.as_deref(),
            Some("NotAuthenticated")
        );
    }
}
