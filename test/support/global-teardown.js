module.exports = () => require('./secrets-scan').teardown();
