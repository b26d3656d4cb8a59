module leoflow.test/k8senv/pause

go 1.25.0
