"""Changes that span provisioning and serving: a new stack row rolled out over a serving group, host by host
(npuops.upgrade.stack). Above npuops.launch and npuops.provision, which must not import each other."""
