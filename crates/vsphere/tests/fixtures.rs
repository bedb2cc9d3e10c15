//! Captured SOAP responses (vcsim, and the real vSphere shapes where vcsim differs) parse into the right
//! values and faults, whichever prefix names the XML Schema instance namespace.

use ferry_vsphere::soap::{Response, decode_method_fault, parse_response};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn fault_of(method: &str, file: &str) -> (String, String) {
    match parse_response(method, &fixture(file)).unwrap() {
        Response::Fault(f) => (f.type_, f.message),
        Response::Ok(_) => panic!("{file} should be a fault"),
    }
}

#[test]
fn soap_faults_decode_by_their_detail_type() {
    assert_eq!(
        fault_of("Login", "fault-invalid-login.xml"),
        ("InvalidLogin".into(), "Login failure".into())
    );
    assert_eq!(
        fault_of("RetrievePropertiesEx", "fault-managed-object-not-found.xml").0,
        "ManagedObjectNotFound"
    );
    assert_eq!(
        fault_of("RetrievePropertiesEx", "fault-not-authenticated.xml").0,
        "NotAuthenticated"
    );
}

#[test]
fn a_failed_task_decodes_its_localized_method_fault() {
    let Response::Ok(response) = parse_response(
        "RetrievePropertiesEx",
        &fixture("task-error-invalid-power-state.xml"),
    )
    .unwrap() else {
        panic!("fault");
    };
    let info = response.find("val").unwrap();
    assert_eq!(
        info.xsi_type.as_deref(),
        Some("TaskInfo"),
        "vcsim's _XMLSchema-instance prefix resolves"
    );
    assert_eq!(info.text_at(&["state"]), Some("error"));
    let fault = decode_method_fault(info.child("error").unwrap());
    assert_eq!(fault.type_, "InvalidPowerState");
    assert_eq!(
        fault.detail.unwrap().text_at(&["existingState"]),
        Some("poweredOff")
    );
}

#[test]
fn the_same_document_under_the_xsi_prefix_parses_the_same() {
    let vcsim = fixture("task-error-invalid-power-state.xml");
    let real = vcsim
        .replace(
            r#" xmlns:_XMLSchema-instance="http://www.w3.org/2001/XMLSchema-instance""#,
            "",
        )
        .replace("_XMLSchema-instance:type", "xsi:type");
    assert_ne!(vcsim, real);
    let types = |doc: &str| match parse_response("RetrievePropertiesEx", doc).unwrap() {
        Response::Ok(r) => {
            let info = r.find("val").unwrap().clone();
            (
                info.xsi_type.clone(),
                info.at(&["error", "fault"]).unwrap().xsi_type.clone(),
            )
        }
        Response::Fault(_) => panic!("fault"),
    };
    assert_eq!(types(&vcsim), types(&real));
    assert_eq!(
        types(&real),
        (Some("TaskInfo".into()), Some("InvalidPowerState".into()))
    );
}
