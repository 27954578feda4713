fn main() {
    print!("{}", memprof::api::crds_yaml());
}
