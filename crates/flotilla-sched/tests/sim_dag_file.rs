//! The DAG file as `flotilla simulate --dag FILE.json` reads it, through the public API only.

use flotilla_sched::{parse_dag, simulate, PolicyKind, Schedule};

#[test]
fn every_policy_simulates_the_paper_dag_file_into_the_cli_shape() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/topcuoglu2002.json");
    let text = std::fs::read_to_string(path).unwrap();
    let dag = parse_dag(&text).unwrap();
    assert_eq!(dag.tasks().len(), 10);
    assert_eq!(dag.edges().len(), 15);
    for kind in PolicyKind::ALL {
        let schedule = simulate(&dag, kind, 7).unwrap();
        schedule.validate(&dag).unwrap();
        let json = serde_json::to_value(&schedule).unwrap();
        assert_eq!(json["policy"], kind.to_string());
        assert_eq!(json["placements"].as_array().unwrap().len(), 10);
        let back: Schedule = serde_json::from_value(json).unwrap();
        assert_eq!(back, schedule);
    }
    assert_eq!(simulate(&dag, PolicyKind::Heft, 0).unwrap().makespan, 80.0);
}
