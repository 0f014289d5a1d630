pub fn run(_: DemoArgs) -> Result<(), String> {
    Err("todo".into())
}
#[derive(clap::Args, Debug)]
pub struct DemoArgs {}
