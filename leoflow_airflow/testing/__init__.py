"""TEST ONLY helpers of the control plane, used only when ``[leoflow] test_fault_injection`` is on."""
