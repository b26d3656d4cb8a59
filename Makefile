# leoflow — two set-up commands on a fresh machine: `make demo` and `make test`. Each does its own set-up.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.leoflow-installed
# setuptools' "Editable installation" notice (a boxed warning on every editable build) reads like an error in a
# first-time set-up; only that warning is silenced
EDITABLE := PYTHONWARNINGS="ignore:Editable installation:UserWarning"

.PHONY: demo demo-k8s test test-fast test-k8s bench bench-k8s venv clean

$(STAMP): pyproject.toml constraints.txt tests/plugin_pkg/pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found (leoflow needs Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(EDITABLE) $(PY) -m pip install -q -c constraints.txt -e '.[test]'
	$(EDITABLE) $(PY) -m pip install -q --no-deps -e tests/plugin_pkg
	touch $(STAMP)

venv: $(STAMP)

## make demo: a real Airflow (SQLite) with LeoflowExecutor in Lite mode runs the bundled DAGs.
demo: $(STAMP)
	$(PY) -m devtools.demo

## make demo-k8s (optional): the same DAGs with [leoflow] runtime = kubernetes, a pod per attempt on the
## scripts/k8senv control plane's real node: a kubelet and containerd running leoflow's agent image (needs root;
## installs containerd, runc, the CNI plugins and mmdebstrap from Debian, builds the k8s binaries and the image on
## first use). `make demo-k8s DEMO_ARGS="--node harness"` runs the pods in the node harness instead.
demo-k8s: $(STAMP)
	scripts/k8senv.d/install-node-packages
	$(PY) -m devtools.demo --runtime kubernetes $(DEMO_ARGS)

## make test: the whole suite (starts PostgreSQL and the Kubernetes control plane itself); PYTEST_ARGS go to pytest
## (`make test PYTEST_ARGS=--chaos` adds the opt-in chaos suites).
test:
	scripts/run-tests all $(PYTEST_ARGS)

## make test-fast: unit tests only, no servers.
test-fast: $(STAMP)
	scripts/run-tests fast

## make test-k8s: only the Kubernetes control-plane tier (builds kube-apiserver & co. on first use).
test-k8s: $(STAMP)
	scripts/run-tests k8s

## make bench: LocalExecutor vs LeoflowExecutor on PostgreSQL (minutes; figures, not pass/fail).
bench: $(STAMP)
	scripts/run-tests bench

## make bench-k8s: the Kubernetes runtime on kwok at 10/100/1,000 attempts in flight (bench.kube_scale), the
## whole lifecycle cycle of sync() at 1,000 and 10,000 running pods (bench.kube_reap; about half an hour: the
## 10,000 creates), then KubernetesExecutor vs leoflow on the node harness (bench.kube_compare; makes the KE venv
## under ~/.cache/leoflow-bench on first use; needs root for the harness). Figures (kube_reap prints its bar as
## PASS/FAIL lines; a FAIL does not fail the target).
bench-k8s: $(STAMP)
	$(PY) -m bench.kube_scale
	$(PY) -m bench.kube_reap
	$(PY) -m bench.kube_compare

clean:
	rm -rf $(VENV) .demo .tmp *.egg-info
