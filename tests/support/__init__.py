"""What the tests share: test networks (``nets``), independent statements of the device arithmetic
(``ascend_reference``) and of the deploy graph (``deploy_interpreter``), and demo projects to build
(``project``)."""
