//! End-to-end tests: kube-sim, moto_server and the real binary, driven with kubectl.
